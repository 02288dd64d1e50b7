"""The registration socket under a flood without a token (issue 28): idle connections held open do
not delay a real registration, the server holds at most its cap, and refusals do not flood the log."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from gpupool.api.shim_contract import RegisterRequest, decode_reply, encode_request
from gpupool.nodeagent.isolation.shim_socket import MAX_CONNECTIONS, READ_TIMEOUT_S, RegistrationServer
from tests.nodeagent.isolation.shim_client import exchange
from tests.nodeagent.isolation.test_shim_socket import GOOD, serving

IDLE = 1000


def dropped(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (its reply, if any, waits unread)."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


@contextmanager
def idle_connections(path: str, n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections to ``path`` that never send (blocking connects: call from a thread)."""
    with ExitStack() as stack:
        socks = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket(socket.AF_UNIX))
            sock.connect(path)
            socks.append(sock)
        yield socks


@pytest.mark.slow
def test_a_valid_registration_completes_while_1000_idle_connections_are_held() -> None:
    async def main() -> tuple[float, bool, int]:
        async with serving() as server:
            with ExitStack() as stack:
                crowd = await asyncio.to_thread(lambda: stack.enter_context(idle_connections(server.path, IDLE)))
                await asyncio.sleep(0.3)  # all accepted, and older than the eviction grace
                started = time.monotonic()
                line = await asyncio.to_thread(exchange, server.path, encode_request(GOOD), 10.0)
                took = time.monotonic() - started
                held = sum(1 for s in crowd if not dropped(s))
                return took, decode_reply(line).ok, held

    took, ok, still_open = asyncio.run(main())
    assert ok
    # before: 64 slots held 2 s each, 29.5 s; unloaded, bench/silent_connections.py measures a few ms; the
    # bound leaves room for a CI machine shared by other jobs
    assert took < 3.0, f"the registration took {took:.2f} s behind {IDLE} idle connections"
    assert still_open <= MAX_CONNECTIONS, "the server held more idle connections than its cap"


@pytest.mark.slow
def test_a_registration_gets_through_idle_connections_that_keep_coming_back() -> None:
    """An attacker who reconnects each dropped connection at once still cannot starve a client."""
    async def main() -> list[float]:
        async with serving() as server:
            stop = asyncio.Event()

            def churn() -> None:
                with ExitStack() as stack:
                    socks = [stack.enter_context(socket.socket(socket.AF_UNIX)) for _ in range(400)]
                    for s in socks:
                        s.connect(server.path)
                    while not stop.is_set():
                        for i, s in enumerate(socks):
                            if dropped(s):  # come back at once
                                s.close()
                                socks[i] = stack.enter_context(socket.socket(socket.AF_UNIX))
                                socks[i].connect(server.path)
                        time.sleep(0.01)

            flood = asyncio.create_task(asyncio.to_thread(churn))
            await asyncio.sleep(0.5)
            took = []
            for _ in range(5):
                started = time.monotonic()
                while True:  # as the library does: a busy socket (retry) is asked again, anything else is final
                    reply = decode_reply(await asyncio.to_thread(exchange, server.path, encode_request(GOOD), 10.0))
                    if reply.ok or not reply.retry:
                        break
                    await asyncio.sleep(0.05)
                assert reply.ok, reply
                took.append(time.monotonic() - started)
            stop.set()
            await flood
            return took

    took = asyncio.run(main())
    # Starved, a registration waited out the whole queue (29.5 s behind 200 idle connections). On a
    # loaded two-core machine one of five once took 3.2 s while the churn thread held the CPU: the
    # median says it is not starved, the worst case that it never waits out a client's timeout.
    assert sorted(took)[len(took) // 2] < 3.0 and max(took) < 8.0, took


def test_the_line_deadline_is_short() -> None:
    """The library writes its line when connected; a connection silent for longer is not it."""
    assert READ_TIMEOUT_S <= 1.0


def test_refusals_are_logged_once_per_interval_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    async def main(server: RegistrationServer) -> None:
        bad = encode_request(RegisterRequest("cd" * 32, 7, "ns/p", "main"))
        for _ in range(200):
            await asyncio.to_thread(exchange, server.path, bad)
        await asyncio.to_thread(exchange, server.path, b"garbage\n")

    async def run() -> None:
        async with serving() as server:
            await main(server)
    with caplog.at_level(logging.INFO, "gpupool.nodeagent.isolation.shim_socket"):
        asyncio.run(run())
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 2, refused  # the first in full, then the summary written at stop
    assert refused[1] == "200 more registrations refused in the last 60 s (malformed: 1, token: 199)"
