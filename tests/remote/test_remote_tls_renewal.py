"""Renewing the GPU server's certificate while clients are connected: the C server loads its
certificate and key again for new connections (on SIGHUP, which the node agent sends after a
renewal, or when the files change, as a rotated Secret's do) and the connections open then keep
their TLS sessions, so their calls go on; files that do not load keep the certificate in use."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpupool.extender.http.certificates import issue_ca
from gpupool.extender.remote_gpu_signer import RequestSigner
from gpupool.nodeagent.remote_certificate import ServerCertificate
from tests.extender.csr_fakes import FakeCsrApi, node_json
from tests.remote.remote_support import (
    Programs,
    Server,
    build_programs,
    client,
    probe_env,
    run_probe,
    running_server,
    token,
    wait_line,
)

pytestmark = pytest.mark.slow

OK = "ok vector_add 1000 c[999]=1498.5"


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return build_programs(tmp_path_factory.mktemp("remote-programs"))


def node_a_certificate(directory: Path) -> ServerCertificate:
    """node-a's certificate as the cluster's signer issues it to the node agent; ``obtain`` again
    is a renewal (same key, a new certificate of a new serial)."""
    api = FakeCsrApi(node="node-a")
    signer = RequestSigner(api, issue_ca("gpupool-remote-gpu-ca"), {"node-a": node_json("node-a", "127.0.0.1")}.get)

    def answer(request: dict[str, Any]) -> None:
        signer.answer(request)

    api.on_create = answer
    keeper = ServerCertificate(api, "node-a", ("127.0.0.1",), directory)
    keeper.obtain(wait_s=1, poll_s=0)
    return keeper


def served_certificate(port: int) -> x509.Certificate:
    """The certificate a new connection is served (the handshake only; the server's connection
    process then waits for a hello that never comes and leaves)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


@contextmanager
def connected_client(programs: Programs, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """A client holding one connection open: each line written runs a vector add on it."""
    process = subprocess.Popen([str(programs.probe), "vector_add_per_line", "1000"], env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert wait_line(process, 30) == "connected"
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


def add_on(connection: subprocess.Popen[str]) -> str:
    assert connection.stdin is not None
    connection.stdin.write("go\n")
    connection.stdin.flush()
    return wait_line(connection, 30)


class ServerLog:
    """The server's output read as it comes (a thread: a text pipe's buffered lines escape select)."""

    def __init__(self, server: Server) -> None:
        self.lines: list[str] = list(server.log)
        self.read = len(self.lines)
        self.thread = threading.Thread(target=self._drain, args=(server,), daemon=True)
        self.thread.start()

    def _drain(self, server: Server) -> None:
        assert server.process.stdout is not None
        for line in server.process.stdout:
            self.lines.append(line)

    def says(self, words: str, timeout: float = 15) -> str:
        """The first line logged after those looked at so far that holds ``words``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while self.read < len(self.lines):
                line = self.lines[self.read]
                self.read += 1
                if words in line:
                    return line
            time.sleep(0.05)
        raise AssertionError(f"the server never said {words!r}: {''.join(self.lines)}")


def env_for(programs: Programs, port: int, keeper: ServerCertificate, tmp_path: Path) -> dict[str, str]:
    ca = tmp_path / "ca.pem"
    ca.write_text(keeper.ca_pem() or "")
    return {**probe_env(programs, f"127.0.0.1:{port}", token("a")), "GPUPOOL_REMOTE_TLS_CA": str(ca)}



def openssl_hex(number: int) -> str:
    """``number`` as OpenSSL's BN_bn2hex writes it in the server's log: upper-case hex in whole bytes,
    so a serial whose top byte is below 0x10 keeps its leading 0 (about one serial in 16)."""
    digits = f"{number:X}"
    return digits.zfill(len(digits) + len(digits) % 2)


def test_a_renewal_signalled_by_sighup_serves_new_connections_and_keeps_open_ones(programs: Programs,
                                                                                   tmp_path: Path) -> None:
    """The node agent's renewal: the certificate file rewritten beside the kept key, then SIGHUP to
    ``gpupool remote-gpu serve``."""
    keeper = node_a_certificate(tmp_path / "node-a")
    first = keeper.current()
    assert first is not None
    files = ["--tls-cert", str(keeper.cert_path), "--tls-key", str(keeper.key_path)]
    with running_server(programs, tmp_path, [client("a")], extra=files) as server:
        env = env_for(programs, server.port, keeper, tmp_path)
        log = ServerLog(server)
        with connected_client(programs, env) as connection:
            before = add_on(connection)
            renewed = keeper.obtain(wait_s=1, poll_s=0)
            os.kill(server.process.pid, signal.SIGHUP)
            reloaded = log.says("reloaded TLS certificate")
            after = add_on(connection)  # the connection made with the old certificate
            served = served_certificate(server.port)
            fresh = run_probe(programs, env, "vector_add", "1000")
            again = add_on(connection)
            assert connection.poll() is None
        assert server.process.poll() is None
    assert renewed.serial_number != first.serial_number
    assert f"serial {openssl_hex(renewed.serial_number)}" in reloaded and "for new connections" in reloaded
    assert [before, after, again] == [OK, OK, OK]
    assert served.serial_number == renewed.serial_number
    assert served.not_valid_after_utc == renewed.not_valid_after_utc
    assert fresh == OK


def test_a_rotated_secret_is_served_to_the_next_connection_without_a_signal(programs: Programs,
                                                                            tmp_path: Path) -> None:
    """The shared Secret's mode: kubelet swaps the mounted files (``tls.crt`` -> ``..data/tls.crt``,
    ``..data`` pointed at a new directory) and tells nobody; the server notices at the next accept."""
    keeper = node_a_certificate(tmp_path / "node-a")
    mounted = tmp_path / "secret"
    mounted.mkdir()

    def project() -> None:  # as kubelet's atomic writer does: a new directory, ..data swapped to it
        version = mounted / f"..{time.monotonic_ns()}"
        version.mkdir()
        shutil.copy(keeper.cert_path, version / "tls.crt")
        shutil.copy(keeper.key_path, version / "tls.key")
        (mounted / "..data_tmp").symlink_to(version.name)
        os.replace(mounted / "..data_tmp", mounted / "..data")
        for name in ("tls.crt", "tls.key"):
            if not (mounted / name).is_symlink():
                (mounted / name).symlink_to(f"..data/{name}")

    project()
    files = ["--tls-cert", str(mounted / "tls.crt"), "--tls-key", str(mounted / "tls.key")]
    with running_server(programs, tmp_path, [client("a")], extra=files) as server:
        env = env_for(programs, server.port, keeper, tmp_path)
        with connected_client(programs, env) as connection:
            first = served_certificate(server.port)
            renewed = keeper.obtain(wait_s=1, poll_s=0)
            project()
            served = served_certificate(server.port)
            after = add_on(connection)
            fresh = run_probe(programs, env, "vector_add", "1000")
    assert first.serial_number != renewed.serial_number
    assert served.serial_number == renewed.serial_number
    assert [after, fresh] == [OK, OK]


def test_a_broken_renewal_keeps_the_certificate_in_use_and_says_so(programs: Programs, tmp_path: Path) -> None:
    """A certificate file that does not parse, then a key that does not match it: each is logged and
    the old pair still serves new connections; the files put right are taken at the next one."""
    keeper = node_a_certificate(tmp_path / "node-a")
    first = keeper.current()
    assert first is not None
    good_cert, good_key = keeper.cert_path.read_bytes(), keeper.key_path.read_bytes()
    files = ["--tls-cert", str(keeper.cert_path), "--tls-key", str(keeper.key_path)]
    with running_server(programs, tmp_path, [client("a")], extra=files) as server:
        env = env_for(programs, server.port, keeper, tmp_path)
        log = ServerLog(server)
        with connected_client(programs, env) as connection:
            keeper.cert_path.write_text("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n")
            os.kill(server.process.pid, signal.SIGHUP)
            kept_broken = log.says("keeping the TLS certificate in use")
            served_broken = served_certificate(server.port)
            keeper.cert_path.write_bytes(good_cert)
            other_key = ec.generate_private_key(ec.SECP256R1())
            keeper.key_path.write_bytes(other_key.private_bytes(serialization.Encoding.PEM,
                                                                serialization.PrivateFormat.PKCS8,
                                                                serialization.NoEncryption()))
            os.kill(server.process.pid, signal.SIGHUP)
            kept_mismatch = log.says("keeping the TLS certificate in use")
            served_mismatch = served_certificate(server.port)
            fresh = run_probe(programs, env, "vector_add", "1000")
            after = add_on(connection)
            keeper.key_path.write_bytes(good_key)
            renewed = keeper.obtain(wait_s=1, poll_s=0)
            served_fixed = served_certificate(server.port)
        assert server.process.poll() is None
    assert kept_broken and kept_mismatch
    assert served_broken.serial_number == served_mismatch.serial_number == first.serial_number
    assert [fresh, after] == [OK, OK]
    assert served_fixed.serial_number == renewed.serial_number
