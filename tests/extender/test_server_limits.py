"""Every port of the extender is bounded (issue 28): silent and slow connections are closed by their
handshake or header deadline, a port holds at most its cap, and a real client still gets through
while silent connections crowd the port. Real sockets on loopback, the extender's own ``serve``."""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from gpupool.netguard.limits import ServerLimits
from tests.extender.tls_world import LOOPBACK, Pki, client_context, get_plain, post_filter, server_files, serving

QUICK = ServerLimits(max_connections=8, handshake_timeout_s=0.3, header_timeout_s=0.3, idle_timeout_s=0.6)


@pytest.fixture(scope="module")
def pki() -> Pki:
    return Pki.make()


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (EOF or reset), None if it stayed open that long."""
    start = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


@contextmanager
def silent(port: int, n: int) -> Iterator[list[socket.socket]]:
    """``n`` TCP connections to ``port`` that never send a byte."""
    with ExitStack() as stack:
        yield [stack.enter_context(socket.create_connection((LOOPBACK, port))) for _ in range(n)]


def test_a_silent_connection_to_the_tls_port_is_closed_after_the_handshake_timeout(
        pki: Pki, tmp_path: Path) -> None:
    with serving(server_files(pki, tmp_path / "srv"), QUICK) as served, silent(served.port, 1) as (sock,):
        took = closed_within(sock, 5)
        assert took is not None, "a connection without a TLS handshake stayed open"
        assert 0.2 < took < 3


@pytest.mark.slow
@pytest.mark.parametrize("port", ["tls", "health"])
def test_a_slow_header_is_closed_after_the_header_timeout(pki: Pki, tmp_path: Path, port: str) -> None:
    with serving(server_files(pki, tmp_path / "srv"), QUICK) as served:
        raw = socket.create_connection((LOOPBACK, served.port if port == "tls" else served.health_port))
        sock: socket.socket = raw
        if port == "tls":  # a client with a good certificate that then dawdles
            sock = client_context(pki.ca, pki.client, tmp_path / "c").wrap_socket(raw, server_hostname=LOOPBACK)
        with sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the header block never ends
            took = closed_within(sock, 5)
            assert took is not None, "a connection whose headers never ended stayed open"
            assert took < 3


def test_a_port_holds_at_most_its_cap_and_refuses_past_it_while_all_are_active(
        pki: Pki, tmp_path: Path) -> None:
    limits = ServerLimits(max_connections=4, header_timeout_s=5, idle_timeout_s=30)
    with serving(server_files(pki, tmp_path / "srv"), limits) as served, ExitStack() as stack:
        active = []
        for _ in range(4):  # kept-alive connections that each made a request: not evictable
            sock = stack.enter_context(socket.create_connection((LOOPBACK, served.health_port)))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            active.append(sock)
        with silent(served.health_port, 1) as (extra,):
            took = closed_within(extra, 3)
            assert took is not None and took < 1, "the fifth connection was not refused"
        active[0].close()
        time.sleep(0.1)
        assert get_plain(served.health_port, "/healthz") == 200  # a freed place is taken again


@pytest.mark.slow
def test_a_real_client_gets_through_a_port_crowded_by_silent_connections(pki: Pki, tmp_path: Path) -> None:
    limits = ServerLimits(max_connections=16, handshake_timeout_s=30, header_timeout_s=30)
    with serving(server_files(pki, tmp_path / "srv"), limits) as served, silent(served.port, 200) as crowd:
        time.sleep(0.5)  # older than the eviction grace
        started = time.monotonic()
        status, _ = post_filter(served.port, client_context(pki.ca, pki.client, tmp_path / "c"))
        assert status == 200 and time.monotonic() - started < 2
        readable, _, _ = select.select(crowd, [], [], 1.0)
        assert len(readable) >= 200 - 16, "the port held more silent connections than its cap"


def test_the_default_limits_are_bounded() -> None:
    limits = ServerLimits()
    assert limits.max_connections <= 1024
    assert limits.handshake_timeout_s <= 10 and limits.header_timeout_s <= 15
    assert limits.idle_timeout_s > 90  # longer than Go's client keeps an idle connection: it closes first


def test_tls_handshakes_that_fail_release_their_place(pki: Pki, tmp_path: Path) -> None:
    """Refused handshakes (no client certificate) must not leak places: after more of them than the
    cap, a client with a certificate still gets an answer."""
    stranger = client_context(pki.ca, None, tmp_path / "anon")
    with serving(server_files(pki, tmp_path / "srv"), QUICK) as served:
        for _ in range(3 * QUICK.max_connections):
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                post_filter(served.port, stranger)
        status, _ = post_filter(served.port, client_context(pki.ca, pki.client, tmp_path / "c"))
        assert status == 200
