"""Keys and certificates for the control plane, made with the ``openssl`` command.

The apiserver could generate a self-signed serving certificate itself, but then clients would
have to skip TLS verification (and urllib3 warns on every request). A throw-away CA per run lets
the kubeconfig carry a real ``certificate-authority`` instead.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path

from gpupool.testenv.errors import StartupError


@dataclass(frozen=True)
class Pki:
    """Paths of the files :func:`make_pki` writes."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    service_account_key: Path

    @classmethod
    def in_dir(cls, directory: Path) -> Pki:
        """The file layout :func:`make_pki` uses in ``directory``."""
        return cls(ca_cert=directory / "ca.crt", server_cert=directory / "apiserver.crt",
                   server_key=directory / "apiserver.key", service_account_key=directory / "sa.key")


def subject_alt_names(hosts: Sequence[str]) -> str:
    """The ``subjectAltName`` value for ``hosts`` (IP addresses and DNS names mixed)."""
    entries = []
    for host in hosts:
        try:
            ip_address(host)
            entries.append(f"IP:{host}")
        except ValueError:
            entries.append(f"DNS:{host}")
    return ",".join(entries)


def make_pki(directory: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost", "kubernetes")) -> Pki:
    """Create a CA, an apiserver serving certificate for ``hosts`` and a service-account key."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki.in_dir(directory)
    ca_key = directory / "ca.key"
    csr = directory / "apiserver.csr"
    ext = directory / "apiserver.ext"
    ext.write_text(
        f"subjectAltName={subject_alt_names(hosts)}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
             "-subj", "/CN=gpupool-testenv-ca", "-keyout", str(ca_key), "-out", str(pki.ca_cert))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
             "-keyout", str(pki.server_key), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "3650", "-extfile", str(ext), "-out", str(pki.server_cert))
    _openssl("genrsa", "-out", str(pki.service_account_key), "2048")
    return pki


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise StartupError(f"openssl {args[0]} failed: {result.stderr.strip()}")
