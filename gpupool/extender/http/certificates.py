"""Issuing the extender's certificates without cert-manager: a CA, a serving and a client certificate.

Used by ``gpupool certs bootstrap`` (:mod:`gpupool.extender.http.cert_secrets` keeps them in
Secrets). Keys are ECDSA P-256: accepted by Go's TLS stack (kube-scheduler) and Python's, and made in
a millisecond where RSA-2048 takes tens. Certificates carry what Go's verifier insists on: subject
alternative names (the common name alone is ignored since Go 1.15), ``serverAuth`` / ``clientAuth``
key usages, and a CA with ``basicConstraints CA:TRUE``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Leaf certificates live a year (rotate with ``gpupool certs bootstrap --rotate``); the CA ten.
LEAF_DAYS = 365
CA_DAYS = 3650
#: Issued a little in the past, so a peer whose clock is behind ours accepts it at once.
BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def private_key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the CA key is not an ECDSA key issued by gpupool certs bootstrap")
        return key


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def issue_ca(common_name: str = "gpupool-extender-ca", days: int = CA_DAYS,
             now: dt.datetime | None = None) -> KeyPair:
    """A self-signed CA that signs the extender's serving and client certificates."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = (now or _now()) - BACKDATE
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def subject_alt_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    """DNS names and IP addresses, each as its own kind (Go matches an IP only against IP SANs)."""
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def issue_leaf(ca: KeyPair, common_name: str, *, server: bool, hosts: Sequence[str] = (),
               days: int = LEAF_DAYS, now: dt.datetime | None = None) -> KeyPair:
    """A serving (``server``, for ``hosts``) or client certificate signed by ``ca``."""
    if server and not hosts:
        raise ValueError("a serving certificate needs at least one host name or address")
    key = ec.generate_private_key(ec.SECP256R1())
    ca_cert, ca_key = ca.certificate, ca.private_key()
    start = (now or _now()) - BACKDATE
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(start)
               .not_valid_after(start + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                            content_commitment=False, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=False, crl_sign=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(subject_alt_names(hosts)), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def service_hosts(service: str, namespace: str, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The names kube-scheduler may reach a Service by (its ``urlPrefix`` host), then ``extra``."""
    base = (service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local")
    return tuple(dict.fromkeys((*base, *extra)))


def hosts_missing(pair: KeyPair, hosts: Sequence[str]) -> list[str]:
    """Those of ``hosts`` that ``pair``'s certificate is not valid for (matched by kind, as Go does)."""
    try:
        present = pair.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return list(hosts)
    have = set(present)
    return [host for name, host in zip(subject_alt_names(hosts), hosts, strict=True) if name not in have]


def expires_within(pair: KeyPair, days: float, now: dt.datetime | None = None) -> bool:
    """Whether ``pair``'s certificate ends within ``days`` (or already has)."""
    return pair.certificate.not_valid_after_utc - (now or _now()) < dt.timedelta(days=days)
