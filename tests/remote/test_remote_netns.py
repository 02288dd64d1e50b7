"""Client and server in two network namespaces joined by a veth pair, so the calls cross a real
network stack (not loopback): the server must be told --allow-plain to listen there."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.remote.remote_support import (
    SERVE,
    Programs,
    build_programs,
    client,
    make_certificates,
    probe_env,
    run_probe,
    running_server,
    token,
)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                 reason="network namespaces need root and iproute2")]


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return build_programs(tmp_path_factory.mktemp("remote-programs"))


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str, str]]:
    """(server namespace, client namespace, the server's address), joined by a veth pair."""
    suffix = f"{os.getpid() % 100000}"
    server_ns, client_ns = f"gpr-s-{suffix}", f"gpr-c-{suffix}"
    octet = os.getpid() % 250
    try:
        ip("netns", "add", server_ns)
        ip("netns", "add", client_ns)
        ip("link", "add", f"vrs{suffix}", "type", "veth", "peer", "name", f"vrc{suffix}")
        for ns, link, address in ((server_ns, f"vrs{suffix}", f"10.251.{octet}.1/30"),
                                  (client_ns, f"vrc{suffix}", f"10.251.{octet}.2/30")):
            ip("link", "set", link, "netns", ns)
            ip("-n", ns, "addr", "add", address, "dev", link)
            ip("-n", ns, "link", "set", link, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield server_ns, client_ns, f"10.251.{octet}.1"
    finally:
        for ns in (server_ns, client_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)


def test_vector_add_across_a_veth_pair(programs: Programs, tmp_path: Path,
                                       namespaces: tuple[str, str, str]) -> None:
    server_ns, client_ns, address = namespaces
    with running_server(programs, tmp_path, [client("a")], listen=f"{address}:0", extra=["--allow-plain"],
                        prefix=["ip", "netns", "exec", server_ns]) as server:
        env = probe_env(programs, f"{address}:{server.port}", token("a"))
        out = run_probe(programs, env, "vector_add", "100000", prefix=["ip", "netns", "exec", client_ns])
        forged = run_probe(programs, probe_env(programs, f"{address}:{server.port}", token("z")), "vector_add", "1",
                           prefix=["ip", "netns", "exec", client_ns])
    assert out == "ok vector_add 100000 c[99999]=149998"
    assert forged == "error 800 at cuInit(0)"


def test_plain_tcp_off_loopback_refused_without_allow_plain(programs: Programs, tmp_path: Path,
                                                            namespaces: tuple[str, str, str]) -> None:
    server_ns, _, address = namespaces
    (tmp_path / "clients.json").write_text('{"version": 1, "clients": []}')
    done = subprocess.run(["ip", "netns", "exec", server_ns, *SERVE, "--listen", f"{address}:7000", "--clients",
                           str(tmp_path / "clients.json")], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "--allow-plain" in done.stderr


def test_tls_across_a_veth_pair_needs_no_allow_plain(programs: Programs, tmp_path: Path,
                                                     namespaces: tuple[str, str, str]) -> None:
    server_ns, client_ns, address = namespaces
    certs = make_certificates(tmp_path, addresses=(address,))
    with running_server(programs, tmp_path, [client("a")], listen=f"{address}:0",
                        extra=["--tls-cert", str(certs.certificate), "--tls-key", str(certs.key)],
                        prefix=["ip", "netns", "exec", server_ns]) as server:
        env = {**probe_env(programs, f"{address}:{server.port}", token("a")), "GPUPOOL_REMOTE_TLS_CA": str(certs.ca)}
        out = run_probe(programs, env, "vector_add", "100000", prefix=["ip", "netns", "exec", client_ns])
    assert out == "ok vector_add 100000 c[99999]=149998"
