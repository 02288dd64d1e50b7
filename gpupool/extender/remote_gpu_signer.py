"""Signing GPU nodes' serving certificates: the signer of :data:`gpupool.api.remote_gpu_certs.SIGNER_NAME`.

A node agent asks for its certificate with a CertificateSigningRequest (the contract is
:mod:`gpupool.api.remote_gpu_certs`). :func:`judge` decides from what the apiserver recorded of the
requester, never from what the requester says of itself:

* the requester is the node agents' ServiceAccount (``spec.username``);
* its token names exactly one node (``spec.extra["authentication.kubernetes.io/node-name"]``, set by
  the apiserver for a pod-bound token from the pod's node), and the request's common name is that node;
* every name asked for is that node: DNS names only the node's name, IP addresses only those of the
  Node's ``status.addresses`` (at least one), nothing else (no URIs, e-mail addresses);
* the usages are ``digital signature`` and ``server auth`` (``key encipherment`` tolerated), the
  request's own signature holds, and the key is ECDSA P-256/P-384 or RSA of 2,048 bits or more.

:func:`sign` then issues a leaf for ``serverAuth`` from its own template (the requested extensions
other than the names checked are ignored), valid :data:`LIFETIME` or the request's
``expirationSeconds`` when shorter (at least :data:`MIN_LIFETIME`). :class:`RequestSigner` applies
both to a request read from the API: approve and sign, or deny with the reason (the agent reads the
reason from the request's conditions and logs it). :func:`start_signer` runs it in the extender
(``--remote-gpu-signer NAMESPACE/SECRET``, the CA's Secret), on the leader, every few seconds.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpupool.api.remote_gpu_certs import NODE_NAME_EXTRA, SIGNER_NAME, TOLERATED_USAGES
from gpupool.extender.http.certificates import BACKDATE, KeyPair

log = logging.getLogger(__name__)

AGENT_USERNAME = "system:serviceaccount:gpupool-node:gpupool-node-agent"
"""Who may ask: the node agents' ServiceAccount, as the chart and kustomize base name it."""
LIFETIME = dt.timedelta(days=30)
"""A serving certificate's longest life (the agent renews it after two thirds)."""
MIN_LIFETIME = dt.timedelta(minutes=10)
"""The shortest life issued, whatever ``expirationSeconds`` asks (Kubernetes' own floor)."""
NODE_ADDRESS_TYPES = frozenset({"InternalIP", "ExternalIP"})
"""Kinds of ``Node.status.addresses`` a certificate may name."""


@dataclass(frozen=True)
class Verdict:
    """Whether to sign a request; ``reason`` says why not (written into the Denied condition)."""

    node: str
    reason: str = ""

    @property
    def approved(self) -> bool:
        return not self.reason


def node_addresses(node: Mapping[str, Any] | None) -> set[str]:
    """The IP addresses (InternalIP, ExternalIP) of a Node (JSON); empty for no Node."""
    found: set[str] = set()
    for entry in ((node or {}).get("status") or {}).get("addresses") or ():
        if entry.get("type") in NODE_ADDRESS_TYPES:
            try:
                found.add(str(ipaddress.ip_address(entry.get("address", ""))))
            except ValueError:
                continue
    return found


def is_pending(request: Mapping[str, Any]) -> bool:
    """Whether a request of this signer still waits for an answer (no certificate, no verdict)."""
    spec, status = request.get("spec") or {}, request.get("status") or {}
    if spec.get("signerName") != SIGNER_NAME or status.get("certificate"):
        return False
    decided = {c.get("type") for c in status.get("conditions") or () if c.get("status", "True") == "True"}
    return not decided & {"Approved", "Denied", "Failed"}


def _requested_names(request: x509.CertificateSigningRequest) -> tuple[list[str], list[str], int]:
    """DNS names, IP addresses, and how many names of any other kind the request asks for."""
    try:
        names = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], [], 0
    dns = names.get_values_for_type(x509.DNSName)
    ips = [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    return dns, ips, len(list(names)) - len(dns) - len(ips)


def _key_problem(request: x509.CertificateSigningRequest) -> str:
    key = request.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        curve = key.curve.name
        return "" if curve in ("secp256r1", "secp384r1") else f"ECDSA curve {curve} is not P-256 or P-384"
    if isinstance(key, rsa.RSAPublicKey):
        return "" if key.key_size >= 2048 else f"an RSA key of {key.key_size} bits is shorter than 2048"
    return "the key is neither ECDSA nor RSA"


def judge(request: Mapping[str, Any], addresses_of: Callable[[str], set[str]],
          agent_username: str = AGENT_USERNAME) -> Verdict:
    """Whether ``request`` (a CertificateSigningRequest, JSON) may be signed; ``addresses_of(node)``
    gives the Node's IP addresses (empty when there is no such Node)."""
    spec = request.get("spec") or {}
    extra = (spec.get("extra") or {}).get(NODE_NAME_EXTRA) or []
    node = extra[0] if len(extra) == 1 else ""
    if spec.get("username") != agent_username:
        return Verdict(node, f"asked by {spec.get('username')!r}, not the node agents' ServiceAccount {agent_username}")
    if not node:
        return Verdict(node, "the requester's token names no node (a pod-bound ServiceAccount token does: "
                             f"{NODE_NAME_EXTRA}, Kubernetes 1.30+)")
    try:
        csr = x509.load_pem_x509_csr(base64.b64decode(spec.get("request", ""), validate=True))
    except ValueError as exc:
        return Verdict(node, f"spec.request is not a PEM certificate request ({exc})")
    if not csr.is_signature_valid:
        return Verdict(node, "the certificate request's signature does not hold")
    usages = set(spec.get("usages") or ())
    if "server auth" not in usages or not usages <= TOLERATED_USAGES:
        return Verdict(node, f"usages {sorted(usages)}: expected 'digital signature' and 'server auth'")
    problem = _key_problem(csr)
    if problem:
        return Verdict(node, problem)
    names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(csr.subject) != 1 or len(names) != 1 or names[0].value != node:
        return Verdict(node, f"the subject must be the common name {node!r} alone (the requester's node), "
                             f"not {csr.subject.rfc4514_string()!r}")
    dns, ips, others = _requested_names(csr)
    if others:
        return Verdict(node, "only DNS names and IP addresses may be asked for")
    if any(name != node for name in dns):
        return Verdict(node, f"DNS names {dns}: only the node's name {node!r} may be asked for")
    if not ips:
        return Verdict(node, "no IP address asked for: clients dial the node's IP")
    known = addresses_of(node)
    foreign = [ip for ip in ips if ip not in known]
    if foreign:
        return Verdict(node, f"{', '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} not among node "
                             f"{node}'s addresses ({', '.join(sorted(known)) or 'no such Node'})")
    return Verdict(node)


def lifetime(request: Mapping[str, Any]) -> dt.timedelta:
    """How long the certificate lives: :data:`LIFETIME`, or ``expirationSeconds`` when shorter."""
    asked = (request.get("spec") or {}).get("expirationSeconds")
    if not isinstance(asked, int) or asked <= 0:
        return LIFETIME
    return max(MIN_LIFETIME, min(LIFETIME, dt.timedelta(seconds=asked)))


def sign(ca: KeyPair, request: Mapping[str, Any], now: dt.datetime | None = None) -> bytes:
    """The PEM chain for a request :func:`judge` approved: the certificate (its node, its names,
    ``serverAuth``) then the CA's, which the agent hands to its clients to check the server with."""
    csr = x509.load_pem_x509_csr(base64.b64decode(request["spec"]["request"]))
    ca_cert, ca_key = ca.certificate, ca.private_key()
    start = (now or dt.datetime.now(dt.UTC)) - BACKDATE
    names = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    cert = (x509.CertificateBuilder().subject_name(csr.subject).issuer_name(ca_cert.subject)
            .public_key(csr.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + BACKDATE + lifetime(request))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM) + ca.cert_pem


def _resource_version(answer: Any) -> str:
    """The ``resourceVersion`` of what the approval returned (JSON or the client's model object), so the
    status update that follows is not refused as stale."""
    if isinstance(answer, Mapping):
        return str((answer.get("metadata") or {}).get("resourceVersion") or "")
    return str(getattr(getattr(answer, "metadata", None), "resource_version", None) or "")


class RequestSigner:
    """Answers pending requests of the signer: approve and sign, or deny with the reason.

    ``api`` is ``CertificatesV1Api`` (or anything with its two ``replace_…`` calls taking JSON);
    ``read_node(name)`` the Node as JSON, or None."""

    def __init__(self, api: Any, ca: KeyPair, read_node: Callable[[str], Mapping[str, Any] | None],
                 agent_username: str = AGENT_USERNAME) -> None:
        self.api = api
        self.ca = ca
        self.read_node = read_node
        self.agent_username = agent_username

    def answer(self, request: dict[str, Any], now: dt.datetime | None = None) -> Verdict | None:
        """Answer one request; None when it is not a pending request of this signer."""
        if not is_pending(request):
            return None
        name = request["metadata"]["name"]
        verdict = judge(request, lambda node: node_addresses(self.read_node(node)), self.agent_username)
        status = request.setdefault("status", {})
        conditions = status.setdefault("conditions", [])
        stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
        if not verdict.approved:
            log.warning("remote GPU certificate request %s denied: %s", name, verdict.reason)
            conditions.append({"type": "Denied", "status": "True", "reason": "GpupoolDenied",
                               "message": verdict.reason, "lastUpdateTime": stamp})
            self.api.replace_certificate_signing_request_approval(name, request)
            return verdict
        conditions.append({"type": "Approved", "status": "True", "reason": "GpupoolNodeVerified",
                           "message": f"names node {verdict.node} and its addresses only",
                           "lastUpdateTime": stamp})
        approved = self.api.replace_certificate_signing_request_approval(name, request)
        version = _resource_version(approved)
        signed = {**request, "metadata": {**request["metadata"], **({"resourceVersion": version} if version else {})}}
        signed["status"]["certificate"] = base64.b64encode(sign(self.ca, request, now)).decode()
        self.api.replace_certificate_signing_request_status(name, signed)
        log.info("signed the remote GPU serving certificate of node %s (%s)", verdict.node, name)
        return verdict

    def answer_all(self, requests: Iterable[dict[str, Any]], now: dt.datetime | None = None) -> list[Verdict]:
        """Answer every pending request of ``requests`` (an API error on one leaves it for next time)."""
        verdicts = []
        for request in requests:
            try:
                verdict = self.answer(request, now)
            except Exception as exc:  # retried at the next pass; one request must not stop the others
                log.warning("remote GPU certificate request %s: %s", request.get("metadata", {}).get("name"), exc)
                continue
            if verdict is not None:
                verdicts.append(verdict)
        return verdicts


SIGN_EVERY_S = 5.0
"""Seconds between looks for pending requests (a node agent polls its request every second)."""


def secret_ref(value: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` split; ``ValueError`` naming the expected form."""
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"expected NAMESPACE/SECRET, got {value!r}")
    return namespace, name


class CaSecret:
    """The signer's CA from a ``kubernetes.io/tls`` Secret (``tls.crt``, ``tls.key``), read when first
    needed and kept; a Secret not there yet (``gpupool certs remote-gpu-ca`` not run: the chart's and
    kustomize's certificate Job runs it with per-node certificates on) is looked for again at the
    next pass, and each miss logs the command that makes it."""

    def __init__(self, core_v1: Any, namespace: str, name: str) -> None:
        self.core_v1 = core_v1
        self.namespace = namespace
        self.name = name
        self._pair: KeyPair | None = None

    def get(self) -> KeyPair | None:
        if self._pair is None:
            from kubernetes.client.exceptions import ApiException

            try:
                secret = self.core_v1.read_namespaced_secret(self.name, self.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                log.error("remote GPU signer: Secret %s/%s (the CA) not found; node agents get no certificate "
                          "until it exists: gpupool certs remote-gpu-ca --namespace %s --secret %s", self.namespace,
                          self.name, self.namespace, self.name)
                return None
            data = secret.data or {}
            self._pair = KeyPair(base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"]))
        return self._pair


def kube_requests(certificates_v1: Any) -> list[dict[str, Any]]:
    """The requests of this signer, as JSON."""
    import json

    answer = certificates_v1.list_certificate_signing_request(field_selector=f"spec.signerName={SIGNER_NAME}",
                                                              _preload_content=False)
    return list(json.loads(answer.data).get("items") or [])


def kube_node(core_v1: Any, name: str) -> dict[str, Any] | None:
    """The Node as JSON; None when there is none."""
    import json

    from kubernetes.client.exceptions import ApiException

    try:
        return dict(json.loads(core_v1.read_node(name, _preload_content=False).data))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def run_signer(certificates_v1: Any, core_v1: Any, ca: CaSecret, stop: threading.Event,
               is_leader: Callable[[], bool], every_s: float = SIGN_EVERY_S,
               agent_username: str = AGENT_USERNAME) -> None:
    """Answer this signer's pending requests every ``every_s`` (the leader only: two replicas answering
    the same request would conflict) until ``stop`` is set."""
    while True:
        if is_leader():
            try:
                pair = ca.get()
                if pair is not None:
                    signer = RequestSigner(certificates_v1, pair, lambda name: kube_node(core_v1, name),
                                           agent_username)
                    signer.answer_all(request for request in kube_requests(certificates_v1) if is_pending(request))
            except Exception as exc:  # the API down: look again at the next pass
                log.warning("remote GPU signer: %s", exc)
        if stop.wait(every_s):
            return


def start_signer(certificates_v1: Any, core_v1: Any, ca: CaSecret, stop: threading.Event,
                 is_leader: Callable[[], bool], every_s: float = SIGN_EVERY_S,
                 agent_username: str = AGENT_USERNAME) -> threading.Thread:
    """:func:`run_signer` in a daemon thread."""
    thread = threading.Thread(target=run_signer,
                              args=(certificates_v1, core_v1, ca, stop, is_leader, every_s, agent_username),
                              name="remote-gpu-signer", daemon=True)
    thread.start()
    return thread
