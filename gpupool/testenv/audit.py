"""Count what one component asks the apiserver: the audit log of a dedicated identity.

The control plane gives a second static token to :data:`AUDITED_USER` (unrestricted, like the admin
token) and an audit policy that records that user's requests, and nobody else's, at level
``Metadata`` (verb, resource, namespace, name, user agent; no bodies). A test runs the component
under :attr:`gpupool.testenv.controlplane.ControlPlane.audited_kubeconfig` and reads its requests
back with :func:`read_audit_log`.

Why the audit log rather than a counting proxy in front of the apiserver: it is the server's own
record of every request it authenticated, one entry per request however the client reuses
connections, so nothing between the component and the server (TLS termination, the streaming of
watches, timeouts) can change what is measured or how the component behaves. Kubelets, the
scheduler and the tests themselves use the admin token and add nothing to the log.

kube-apiserver (seen on v1.20, and the e2e counts still hold on the current release) writes a
watch's entries only when the watch ends (``ResponseStarted`` too),
and never for a watch cut by a killed apiserver: count watches after the component has closed
them, and attribute requests to the phases of a test by :attr:`AuditedRequest.received`, the time
the server received them, not by when their entry appeared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

#: The user whose requests are audited (the token file's second line).
AUDITED_USER = "gpupool-audited"
#: Stages written per request: when the answer starts (a watch: when it opens) and when it ends.
_STAGES_KEPT = ("ResponseStarted", "ResponseComplete")


def render_audit_policy() -> str:
    """An ``audit.k8s.io/v1`` policy: :data:`AUDITED_USER`'s requests at ``Metadata``, nothing else."""
    policy: dict[str, Any] = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": [AUDITED_USER]}, {"level": "None"}],
    }
    return yaml.safe_dump(policy, sort_keys=False)


def audit_args(policy_file: Path, log_file: Path) -> list[str]:
    """kube-apiserver's audit flags: the policy, a JSON-lines log written as requests happen
    (``blocking`` mode) and never rotated away during a session."""
    return [f"--audit-policy-file={policy_file}", f"--audit-log-path={log_file}", "--audit-log-format=json",
            "--audit-log-mode=blocking", "--audit-log-maxsize=1024", "--audit-log-maxbackup=1"]


@dataclass(frozen=True)
class AuditedRequest:
    """One request of :data:`AUDITED_USER`; ``received`` is the server's clock (Unix seconds);
    ``complete`` is false when only its start was logged; ``code`` is the answer's HTTP status (0
    when the entry has none)."""

    audit_id: str
    received: float
    verb: str
    resource: str
    namespace: str
    name: str
    uri: str
    user_agent: str
    complete: bool
    code: int = 0

    @property
    def what(self) -> str:
        """``verb resource`` (``pods/binding`` for a subresource), for counting and messages."""
        return f"{self.verb} {self.resource}"


def read_audit_log(path: Path) -> list[AuditedRequest]:
    """Every audited request in the log, once each, in the order they started."""
    stages: dict[str, tuple[dict[str, Any], bool, int]] = {}
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        if event.get("user", {}).get("username") != AUDITED_USER or event.get("stage") not in _STAGES_KEPT:
            continue
        seen = stages.get(event["auditID"])
        complete = event["stage"] == "ResponseComplete" or (seen is not None and seen[1])
        code = int((event.get("responseStatus") or {}).get("code") or 0) or (seen[2] if seen else 0)
        stages[event["auditID"]] = (seen[0] if seen else event, complete, code)
    return [_request(event, complete, code) for event, complete, code in stages.values()]


def _request(event: dict[str, Any], complete: bool, code: int = 0) -> AuditedRequest:
    ref = event.get("objectRef") or {}
    resource = str(ref.get("resource", ""))
    if ref.get("subresource"):
        resource = f"{resource}/{ref['subresource']}"
    received = datetime.fromisoformat(str(event["requestReceivedTimestamp"]).replace("Z", "+00:00"))
    return AuditedRequest(audit_id=str(event["auditID"]), received=received.timestamp(),
                          verb=str(event.get("verb", "")), resource=resource,
                          namespace=str(ref.get("namespace", "")), name=str(ref.get("name", "")),
                          uri=str(event.get("requestURI", "")), user_agent=str(event.get("userAgent", "")),
                          complete=complete, code=code)
