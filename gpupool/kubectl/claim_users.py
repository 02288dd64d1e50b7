"""Which containers use a DRA claim, so ``kubectl gpupool inspect`` names them beside the claim.

Why: a claim is booked as one holder named after it (``namespace/claim:name``, the extender's key),
but the workload a reader looks for is the pod container that got its share through it. A claim's
users are the pods its ``status.reservedFor`` names (what kubelet prepares it for); of each, the
containers whose ``resources.claims`` name a ``resourceClaims`` entry that resolves to the claim
(:func:`gpupool.kube.claim_asks.pod_claim_names`: ``resourceClaimName``, or for a template the
claim ``status.resourceClaimStatuses`` records). A reserved pod none of whose containers names the
claim is shown by itself (``namespace/pod``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.kube.claim_asks import pod_claim_names
from gpupool.kube.claim_holding import claim_key


class ClaimUsers:
    """The pods read once, by UID; answers who uses a claim."""

    def __init__(self, pods: Iterable[Mapping[str, Any]]) -> None:
        self._by_uid: dict[str, tuple[str, dict[str, list[str]]]] = {}
        """Pod UID → (``namespace/pod``, claim key → its containers using the claim)."""
        for pod in pods:
            meta = _map(pod.get("metadata"))
            uid, name = str(meta.get("uid") or ""), str(meta.get("name") or "")
            if not uid or not name:
                continue
            namespace = str(meta.get("namespace") or "default")
            self._by_uid[uid] = (f"{namespace}/{name}", _containers_by_claim(pod, namespace))

    def of(self, key: str, reserved_for: Iterable[str]) -> tuple[str, ...]:
        """``namespace/pod/container`` of each container using claim ``key`` among the pods
        ``reserved_for`` names (UIDs), in their order; a pod not read is left out."""
        found: list[str] = []
        for uid in reserved_for:
            pod = self._by_uid.get(uid)
            if pod is None:
                continue
            name, claims = pod
            containers = claims.get(key)
            if containers:
                found.extend(f"{name}/{c}" for c in containers)
            else:
                found.append(name)
        return tuple(dict.fromkeys(found))


def _containers_by_claim(pod: Mapping[str, Any], namespace: str) -> dict[str, list[str]]:
    """Claim key → the pod's containers (init containers first, as the spec lists them) using it."""
    claim_of = {entry: claim for entry, claim in pod_claim_names(pod) if claim}
    spec = _map(pod.get("spec"))
    found: dict[str, list[str]] = {}
    for kind in ("initContainers", "containers"):
        containers = spec.get(kind)
        for container in containers if isinstance(containers, list) else ():
            container = _map(container)
            refs = _map(container.get("resources")).get("claims")
            names = {claim_of.get(str(_map(ref).get("name") or "")) for ref in (refs if isinstance(refs, list) else ())}
            for claim in sorted(n for n in names if n):
                found.setdefault(claim_key(namespace, claim), []).append(str(container.get("name") or "?"))
    return found


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
