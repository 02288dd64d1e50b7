"""``gpupool certs bootstrap``: the extender's CA and certificates kept in three Secrets, made once.

For clusters without cert-manager (with it, see docs/security.md). The layout is cert-manager's
(``tls.crt``, ``tls.key``, ``ca.crt``), so the extender's Deployment mounts the same Secret either way:

* ``<name>``: the extender's serving certificate and key, and ``ca.crt``, the CA its clients'
  certificates must chain to (mounted by the extender);
* ``<name>-client``: kube-scheduler's client certificate and key, and ``ca.crt`` to verify the
  extender (copied to the scheduler's host, or mounted where the scheduler runs as a pod);
* ``<name>-ca``: the CA's certificate and key, read only by this command (to issue and rotate).

Idempotent: a Secret that exists is kept (unless ``rotate``, it is about to expire, or the serving
certificate lacks one of the names asked for: a Service added by an upgrade), so running
the command from every replica, a Job, or twice by hand converges on one CA. Two runs racing to
create the CA: the second one's create gets 409 and it reads the winner's CA.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.extender.http.certificates import KeyPair, expires_within, hosts_missing, issue_ca, issue_leaf

log = logging.getLogger(__name__)

CA_SUFFIX = "-ca"
CLIENT_SUFFIX = "-client"
#: A leaf certificate with less than this left is issued again on the next run.
RENEW_WITHIN_DAYS = 30.0
CLIENT_COMMON_NAME = "kube-scheduler"
SERVER_COMMON_NAME = "gpupool-extender"


@dataclass(frozen=True)
class Bundle:
    """What the three Secrets hold."""

    ca: KeyPair
    server: KeyPair
    client: KeyPair


@dataclass
class BootstrapResult:
    bundle: Bundle
    written: list[str] = field(default_factory=list)
    """Secrets created or replaced by this run (empty: everything was already there)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def secret_body(namespace: str, name: str, pair: KeyPair, ca_pem: bytes | None) -> dict[str, Any]:
    """A ``kubernetes.io/tls`` Secret; ``ca.crt`` when ``ca_pem`` is given."""
    data = {"tls.crt": _b64(pair.cert_pem), "tls.key": _b64(pair.key_pem)}
    if ca_pem is not None:
        data["ca.crt"] = _b64(ca_pem)
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "gpupool-certs-bootstrap"}},
            "data": data}


def pair_of(secret: Any) -> KeyPair:
    """The certificate and key of a Secret read with the official client."""
    data = secret.data or {}
    try:
        return KeyPair(base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"]))
    except KeyError as exc:
        raise ValueError(f"Secret {secret.metadata.name} has no {exc.args[0]}") from None


class SecretStore:
    """Reads and writes the three Secrets through ``CoreV1Api``."""

    def __init__(self, core_v1: Any, namespace: str) -> None:
        self.api = core_v1
        self.namespace = namespace

    def read(self, name: str) -> Any | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.api.read_namespaced_secret(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, name: str, pair: KeyPair, ca_pem: bytes | None) -> bool:
        """Create the Secret; False when someone else created it first (409)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.create_namespaced_secret(self.namespace, secret_body(self.namespace, name, pair, ca_pem))
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def replace(self, existing: Any, pair: KeyPair, ca_pem: bytes | None) -> None:
        """Replace with the read version as precondition (a concurrent rotation gets 409)."""
        body = secret_body(self.namespace, existing.metadata.name, pair, ca_pem)
        body["metadata"]["resourceVersion"] = existing.metadata.resource_version
        self.api.replace_namespaced_secret(existing.metadata.name, self.namespace, body)


def bootstrap(core_v1: Any, namespace: str, name: str, hosts: Sequence[str], *, rotate: bool = False,
              now: dt.datetime | None = None) -> BootstrapResult:
    """Make sure the CA, serving and client Secrets exist (see the module doc); returns what they hold."""
    store = SecretStore(core_v1, namespace)
    written: list[str] = []
    ca_name = name + CA_SUFFIX
    found = store.read(ca_name)
    if found is None:
        if store.read(name) is not None:
            raise ValueError(f"Secret {namespace}/{name} exists but {namespace}/{ca_name} does not: its "
                             "certificates are managed elsewhere (cert-manager?); nothing changed")
        ca = issue_ca(now=now)
        if store.create(ca_name, ca, None):
            written.append(ca_name)
        else:
            found = store.read(ca_name)  # lost the race: use the winner's CA
    ca = pair_of(found) if found is not None else ca
    server = _leaf(store, name, ca, written, rotate, now, server=True, hosts=hosts)
    client = _leaf(store, name + CLIENT_SUFFIX, ca, written, rotate, now, server=False, hosts=())
    return BootstrapResult(Bundle(ca, server, client), written)


def _leaf(store: SecretStore, name: str, ca: KeyPair, written: list[str], rotate: bool,
          now: dt.datetime | None, *, server: bool, hosts: Sequence[str]) -> KeyPair:
    existing = store.read(name)
    if existing is not None:
        pair = pair_of(existing)
        missing = hosts_missing(pair, hosts) if server else []
        if not rotate and not missing and not expires_within(pair, RENEW_WITHIN_DAYS, now):
            return pair
        if missing:  # e.g. a Service added by an upgrade (gpupool-extender-admission)
            log.info("Secret %s/%s is not valid for %s: issuing it again", store.namespace, name, ", ".join(missing))
    pair = issue_leaf(ca, SERVER_COMMON_NAME if server else CLIENT_COMMON_NAME, server=server, hosts=hosts, now=now)
    if existing is not None:
        store.replace(existing, pair, ca.cert_pem)
        written.append(name)
        log.info("replaced Secret %s/%s", store.namespace, name)
    elif store.create(name, pair, ca.cert_pem):
        written.append(name)
    else:
        return pair_of(store.read(name))  # created meanwhile by another run, with the same CA
    return pair


def ensure_ca(core_v1: Any, namespace: str, name: str, common_name: str) -> tuple[KeyPair, bool]:
    """The CA in Secret ``namespace/name``, made when absent; and whether this call made it. Two
    runs racing: the second one's create gets 409 and it reads the winner's CA."""
    store = SecretStore(core_v1, namespace)
    found = store.read(name)
    if found is not None:
        return pair_of(found), False
    ca = issue_ca(common_name)
    if store.create(name, ca, None):
        return ca, True
    return pair_of(store.read(name)), False
