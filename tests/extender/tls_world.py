"""Certificates on disk and an extender served over TLS on a thread, for the TLS tests."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpupool.api.names import ResourceNames
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.http.certificates import KeyPair, issue_ca, issue_leaf
from gpupool.extender.http.serving import Listeners, serve
from gpupool.extender.http.tls import ReloadingTls, TlsFiles
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService
from gpupool.netguard.limits import ServerLimits
from tests.kube.builders import container, node, pod

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Pki:
    """One CA with a serving certificate for loopback and a client certificate."""

    ca: KeyPair
    server: KeyPair
    client: KeyPair

    @staticmethod
    def make(name: str = "ca") -> Pki:
        ca = issue_ca(f"{name}-ca")
        return Pki(ca, issue_leaf(ca, "extender", server=True, hosts=(LOOPBACK, "localhost")),
                   issue_leaf(ca, "kube-scheduler", server=False))


def write(pair: KeyPair, directory: Path, stem: str) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    return cert, key


def server_files(pki: Pki, directory: Path) -> TlsFiles:
    """Serving certificate, key, and the same CA as client CA (the bootstrap's layout)."""
    cert, key = write(pki.server, directory, "tls")
    (directory / "ca.crt").write_bytes(pki.ca.cert_pem)
    return TlsFiles(str(cert), str(key), str(directory / "ca.crt"))


def client_context(trust: KeyPair, identity: KeyPair | None, directory: Path) -> ssl.SSLContext:
    """A Python client that trusts ``trust`` and presents ``identity`` (None: no certificate)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "trust.crt").write_bytes(trust.cert_pem)
    context = ssl.create_default_context(cafile=str(directory / "trust.crt"))
    if identity is not None:
        cert, key = write(identity, directory, "me")
        context.load_cert_chain(str(cert), str(key))
    return context


@dataclass
class Served:
    port: int
    health_port: int
    tls: ReloadingTls


def filter_body() -> bytes:
    return json.dumps({"Pod": pod("p", container(mib=4000)), "NodeNames": ["N1"]}).encode()


def post_filter(port: int, context: ssl.SSLContext) -> tuple[int, dict[str, object]]:
    """POST /filter over HTTPS with ``context``; raises on a refused handshake."""
    conn = http.client.HTTPSConnection(LOOPBACK, port, context=context, timeout=5)
    try:
        conn.request("POST", "/filter", filter_body(), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def get_plain(port: int, path: str) -> int:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


@contextmanager
def serving(files: TlsFiles, limits: ServerLimits | None = None) -> Iterator[Served]:
    """An extender (one node, N1) on loopback over TLS, plus its plain health port (``limits``: the
    ports' caps and timeouts; the defaults when None)."""
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("N1", [16276])])
    cache.replace_pods([])
    api = ExtenderApi(ExtenderService(cache, None), ResourceNames(), ExtenderMetrics(ledger=cache))
    tls = ReloadingTls(files, interval_s=3600)
    listeners = Listeners(LOOPBACK, free_port(), tls, free_port(), limits=limits or ServerLimits())
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    started = threading.Event()

    async def main() -> None:
        started.set()
        await serve(api.app(), api.probe_app(), listeners, stop)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    started.wait(5)
    for _ in range(100):  # until the sites listen
        try:
            get_plain(listeners.health_port or 0, "/healthz")
            break
        except OSError:
            threading.Event().wait(0.05)
    try:
        yield Served(listeners.port, listeners.health_port or 0, tls)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
