"""A GPU node's own serving certificate for its remote GPU server, asked of the cluster's signer.

The agent makes the private key here, on the node (a file of mode 0600 in its state directory; it
never leaves the node and is kept across restarts), and asks for the certificate with a
CertificateSigningRequest of :data:`gpupool.api.remote_gpu_certs.SIGNER_NAME`: its node's name and
IP addresses, sent with the agent's pod-bound ServiceAccount token, which the signer checks
(:mod:`gpupool.extender.remote_gpu_signer`). The issued certificate is written beside the key.

:meth:`ServerCertificate.due` says when to ask: no certificate yet, one for other addresses (the
node's changed), one not signed for this key, or two thirds of its life gone (so a signer down for a
while still leaves a third of the life to retry in).

A refused request (its ``Denied`` or ``Failed`` condition) keeps its answer: asked again under the
same name, the apiserver answers 409 and the agent would read the same denial until
kube-controller-manager removes the request an hour later, whatever was fixed meanwhile. So each
request's name carries an attempt count (:func:`gpupool.api.remote_gpu_certs.request_name`): after
a refusal the next request is a new object, which the signer answers afresh. An agent that restarts
starts counting at 0 and steps past the refused requests it finds under its names (each a 409 and a
read). The alternative, deleting the refused request before asking again, would need ``delete`` of
``certificatesigningrequests``, which RBAC cannot narrow to the agent's own requests (their names
are not known in advance and the resource is cluster-wide): every node's agent could then delete
every request in the cluster, other nodes' and kubelets' included. A new name needs no verb beyond
the ``create`` and ``get`` the agent has. What it costs, one object per refusal until
kube-controller-manager removes it after an hour, is bounded by the agent's widening pause between
refusals (:func:`gpupool.nodeagent.remote_setup.retry_after`).
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpupool.api.remote_gpu_certs import SIGNER_NAME, USAGES, addresses_named, node_request_pem, request_name

log = logging.getLogger(__name__)

KEY_FILE = "remote-gpu-tls.key"
CERT_FILE = "remote-gpu-tls.crt"
RENEW_AFTER = 2 / 3
"""The share of a certificate's life after which it is asked for again."""
WAIT_S = 120.0
"""How long :meth:`ServerCertificate.obtain` waits for the signer's answer."""
POLL_S = 1.0


class CertificateRefused(RuntimeError):
    """The signer denied the request (the message is its reason) or gave no answer in time."""


class CertificateDenied(CertificateRefused):
    """The request carries a ``Denied`` or ``Failed`` condition: the next one is a new request."""


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def load_or_make_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The node's key (ECDSA P-256) from ``path``, made there (mode 0600) when absent or unreadable."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if isinstance(key, ec.EllipticCurvePrivateKey):
            return key
        log.warning("%s is not an ECDSA key: making a new one", path)
    except FileNotFoundError:
        pass
    except ValueError as exc:
        log.warning("%s is not a PEM key (%s): making a new one", path, exc)
    key = ec.generate_private_key(ec.SECP256R1())
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()), 0o600)
    return key


def request_manifest(node: str, request_pem: bytes, replaces: x509.Certificate | None = None,
                     attempt: int = 0) -> dict[str, Any]:
    """The CertificateSigningRequest asking for ``request_pem`` (:func:`node_request_pem`), renewing
    ``replaces`` when given, after ``attempt`` refused requests for the same (each of these makes its
    name differ from the first request's)."""
    previous = replaces.public_bytes(serialization.Encoding.DER) if replaces is not None else b""
    return {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": request_name(node, request_pem, previous, attempt),
                         "labels": {"app.kubernetes.io/managed-by": "gpupool-node-agent"}},
            "spec": {"signerName": SIGNER_NAME, "usages": list(USAGES),
                     "request": base64.b64encode(request_pem).decode("ascii")}}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class ServerCertificate:
    """The node's key and certificate files, and asking the signer for the certificate.

    ``api`` is ``CertificatesV1Api`` answering JSON (``_preload_content=False`` is not needed: the
    fields read are ``status.certificate`` and ``status.conditions``, through :func:`_field`)."""

    def __init__(self, api: Any, node: str, addresses: Sequence[str], directory: Path, *,
                 now: Callable[[], dt.datetime] = _now, sleep: Callable[[float], None] = time.sleep) -> None:
        if not addresses:
            raise ValueError("the node's serving certificate needs at least one IP address")
        self.api = api
        self.node = node
        self.addresses = tuple(dict.fromkeys(addresses))
        self.key_path = directory / KEY_FILE
        self.cert_path = directory / CERT_FILE
        self.now = now
        self.sleep = sleep
        self.attempt = 0
        """Requests refused so far (in this process, or found refused under the names before): the
        next request's name carries it."""

    def current(self) -> x509.Certificate | None:
        """The certificate on disk, or None."""
        try:
            return x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        except (FileNotFoundError, ValueError):
            return None

    def ca_pem(self) -> str | None:
        """The CA the signer put after the certificate (the chain's last), PEM; None without one."""
        try:
            chain = x509.load_pem_x509_certificates(self.cert_path.read_bytes())
        except (FileNotFoundError, ValueError):
            return None
        return chain[-1].public_bytes(serialization.Encoding.PEM).decode("ascii") if len(chain) > 1 else None

    def due(self) -> str:
        """Why the certificate must be asked for now ("" when the one on disk is good)."""
        cert = self.current()
        if cert is None:
            return "no certificate yet"
        if addresses_named(cert) != set(self.addresses):
            return f"it names {sorted(addresses_named(cert))}, the node has {sorted(self.addresses)}"
        key = load_or_make_key(self.key_path)
        if cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) \
                != key.public_key().public_bytes(serialization.Encoding.DER,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo):
            return "it is not for this node's key"
        start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
        if self.now() >= start + (end - start) * RENEW_AFTER:
            return f"two thirds of its life are gone (it ends {end:%Y-%m-%d %H:%M} UTC)"
        return ""

    def renew_at(self) -> dt.datetime | None:
        """When the certificate on disk is due for renewal (None: there is none)."""
        cert = self.current()
        if cert is None:
            return None
        start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
        return start + (end - start) * RENEW_AFTER

    def obtain(self, wait_s: float = WAIT_S, poll_s: float = POLL_S) -> x509.Certificate:
        """Ask for the certificate and write it beside the key; :class:`CertificateDenied` when the
        signer denies it (with its reason; the next call asks under a new name),
        :class:`CertificateRefused` when it does not answer within ``wait_s`` (the next call waits
        for the same request)."""
        key = load_or_make_key(self.key_path)
        name = self._ask(node_request_pem(key, self.node, self.addresses), self.current())
        deadline = time.monotonic() + wait_s
        while True:
            status = _field(self.api.read_certificate_signing_request(name), "status") or {}
            refusal = _refusal(status)
            if refusal:
                self.attempt += 1
                raise CertificateDenied(f"{name}: {refusal}")
            issued = _field(status, "certificate")
            if issued:
                pem = base64.b64decode(issued) if isinstance(issued, str) else bytes(issued)
                cert = x509.load_pem_x509_certificate(pem)
                _write_atomically(self.cert_path, pem, 0o644)
                log.info("remote GPU serving certificate of %s issued (%s), valid until %s", self.node, name,
                         cert.not_valid_after_utc)
                return cert
            if time.monotonic() >= deadline:
                raise CertificateRefused(f"{name}: no answer from the signer {SIGNER_NAME} in {wait_s:g} s "
                                         "(is the extender running with --remote-gpu-signer?)")
            self.sleep(poll_s)

    def _ask(self, request_pem: bytes, replaces: x509.Certificate | None) -> str:
        """Create the request and return its name. A request of the same name that exists already
        (409: this agent asked before it restarted) is waited for, unless it was refused: then the
        next attempt's name is tried (module docstring)."""
        from kubernetes.client.exceptions import ApiException

        while True:
            manifest = request_manifest(self.node, request_pem, replaces, self.attempt)
            name: str = manifest["metadata"]["name"]
            try:
                self.api.create_certificate_signing_request(manifest)
                return name
            except ApiException as exc:
                if exc.status != 409:
                    raise
            refusal = _refusal(_field(self.api.read_certificate_signing_request(name), "status") or {})
            if not refusal:
                return name  # asked before and not answered yet, or answered with the certificate
            log.info("remote GPU: %s was refused before (%s); asking under a new name", name, refusal)
            self.attempt += 1


def _refusal(status: Any) -> str:
    """``"Denied: <reason>"`` or ``"Failed: <reason>"`` from a request's conditions; "" when neither."""
    for condition in _field(status, "conditions") or ():
        if _field(condition, "type") in ("Denied", "Failed") and _field(condition, "status") != "False":
            return f"{_field(condition, 'type')}: {_field(condition, 'message')}"
    return ""


def _field(value: Any, name: str) -> Any:
    """``value[name]`` of JSON, or the attribute of the client's model object."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)
