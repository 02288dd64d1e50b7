"""The contract of a GPU node's own serving certificate: a Kubernetes CertificateSigningRequest.

A GPU node's agent proves to its remote clients that it serves for its node, and only that node,
with a TLS certificate of its own: it makes the private key on the node (it never leaves it) and
asks for the certificate with a ``certificates.k8s.io/v1`` CertificateSigningRequest of signer
:data:`SIGNER_NAME`. The apiserver records who asked (``spec.username`` and ``spec.extra``: with the
agent's pod-bound ServiceAccount token, the node its pod runs on, which the container cannot choose,
as the heartbeat Lease policy relies on), so the signer (the extender) can check that the
certificate asked for names the requester's node and that node's addresses only, and sign it with
the cluster's remote-GPU CA. Clients dial the node's IP and check that the certificate chains to
that CA and names the IP they dialled: a certificate signed for one node names none of another
node's addresses, so one node's key cannot serve as another.

What a request holds (both sides build or check exactly this):

* subject: the common name ``<node>`` alone;
* subject alternative names: DNS ``<node>`` (optional) and at least one IP address of the node;
* ``spec.usages``: ``digital signature`` and ``server auth`` (``key encipherment`` is tolerated);
* the key: ECDSA P-256 or P-384, or RSA of at least 2,048 bits.

Extensions the request carries beyond its names are ignored: the signer builds the certificate
from its own template (a leaf for ``serverAuth``), never from what was asked.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SIGNER_NAME = "gpupool.io/remote-gpu-server"
"""The CertificateSigningRequest signer of GPU nodes' serving certificates."""
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
"""The user-info extra a pod-bound ServiceAccount token carries: the node its pod runs on."""
USAGES = ("digital signature", "server auth")
"""``spec.usages`` of a request."""
TOLERATED_USAGES = frozenset({*USAGES, "key encipherment"})
"""Usages a request may name (``key encipherment`` is what RSA clients add by habit)."""
NAME_PREFIX = "gpupool-remote-gpu-"
"""CertificateSigningRequest names: ``<prefix><node>-<digest>``, one per request."""


def node_request_pem(key: ec.EllipticCurvePrivateKey, node: str, addresses: Sequence[str]) -> bytes:
    """The PEM certificate request of ``node``'s serving certificate for its IP ``addresses``."""
    if not addresses:
        raise ValueError("a serving certificate needs at least one IP address of the node")
    names: list[x509.GeneralName] = [x509.DNSName(node)]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in dict.fromkeys(addresses)]
    request = (x509.CertificateSigningRequestBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
               .add_extension(x509.SubjectAlternativeName(names), critical=False)
               .sign(key, hashes.SHA256()))
    return request.public_bytes(serialization.Encoding.PEM)


def request_name(node: str, request_pem: bytes, replaces: bytes = b"", attempt: int = 0) -> str:
    """The CertificateSigningRequest's name: the node and a digest of what the request asks for (its
    key and names, not its signature, which ECDSA makes anew each time), of ``replaces``, the
    certificate being renewed (DER; empty for the first), and of ``attempt``, how many requests for
    the same thing were refused before (0: none; the digest is then the one without an attempt). An
    agent that restarts while it waits asks under the same name (409) and waits for its first
    request; a renewal, a new key or new addresses get a new name, and so does asking again after a
    denial, which a signer fixed since can then answer (a refused request keeps its answer)."""
    if attempt < 0:
        raise ValueError(f"attempt {attempt} < 0")
    asked = x509.load_pem_x509_csr(request_pem).tbs_certrequest_bytes
    suffix = b"\0attempt %d" % attempt if attempt else b""
    digest = hashlib.sha256(asked + b"\0" + replaces + suffix).hexdigest()[:10]
    return f"{NAME_PREFIX}{node[:253 - len(NAME_PREFIX) - 11]}-{digest}"


def addresses_named(certificate: x509.Certificate) -> set[str]:
    """The IP addresses a certificate's subject alternative names hold, as strings."""
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
