"""Registration with the node agent: one JSON line per process, never a condition for the limits."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.shim.fake_agent import FakeAgent, replying
from tests.shim.toolchain import Toolchain, codes, run_probe

# Slow, so scripts/test-all runs it and a plain pytest does not: each case waits out the library's registration
# retries, plain and under ASan.
pytestmark = pytest.mark.slow

OK, OUT_OF_MEMORY = 0, 2
TOKEN = "ab" * 32
WAIT_FOR_REGISTRATION = "sleep:500"  # registration runs on a thread of its own


@pytest.fixture()
def agent(work: Path) -> Iterator[FakeAgent]:
    served = FakeAgent(work / "agent.sock", replying(b'{"v":1,"ok":true}\n'))
    yield served
    served.close()


def registering_env(tc: Toolchain, work: Path, socket_path: Path) -> dict[str, str]:
    return tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024", GPUPOOL_SHIM_TOKEN=TOKEN,
                  GPUPOOL_AGENT_SOCKET=str(socket_path), GPUPOOL_POD='team-a/trainer"1', GPUPOOL_CONTAINER="main",
                  GPUPOOL_SHIM_LOG="info")


def test_a_process_registers_once_with_its_token(tc: Toolchain, work: Path, agent: FakeAgent) -> None:
    env = registering_env(tc, work, work / "agent.sock")
    steps, stderr = run_probe(tc, env, "symbol", "alloc:1g", WAIT_FOR_REGISTRATION)
    assert codes(steps) == [OK, OK]
    assert len(agent.requests) == 1
    request = agent.requests[0]
    assert request == {"v": 1, "op": "register", "token": TOKEN, "pid": request["pid"],
                       "pod": 'team-a/trainer"1', "container": "main"}
    assert isinstance(request["pid"], int) and request["pid"] > 0
    assert "registered with the node agent" in stderr


def test_limits_hold_when_the_agent_refuses(tc: Toolchain, work: Path) -> None:
    refusing = FakeAgent(work / "agent.sock", replying(b'{"v":1,"ok":false,"reason":"unknown token"}\n'))
    try:
        steps, stderr = run_probe(tc, registering_env(tc, work, work / "agent.sock"), "symbol", WAIT_FOR_REGISTRATION,
                                  "alloc:2g")
    finally:
        refusing.close()
    assert codes(steps) == [OK, OUT_OF_MEMORY]
    assert "unknown token" in stderr


def test_limits_hold_when_the_agent_is_unreachable(tc: Toolchain, work: Path) -> None:
    steps, stderr = run_probe(tc, registering_env(tc, work, work / "nobody.sock"), "symbol", WAIT_FOR_REGISTRATION,
                              "alloc:2g")
    assert codes(steps) == [OK, OUT_OF_MEMORY]
    assert "node agent unreachable" in stderr


def test_an_agent_that_comes_up_late_is_tried_again(tc: Toolchain, work: Path) -> None:
    """The agent restarting (no socket yet) when the process starts: the library tries again."""
    socket_path = work / "late.sock"
    started: list[FakeAgent] = []
    timer = threading.Timer(0.6, lambda: started.append(FakeAgent(socket_path, replying(b'{"v":1,"ok":true}\n'))))
    timer.start()
    try:
        steps, stderr = run_probe(tc, registering_env(tc, work, socket_path), "symbol", "alloc:1g", "sleep:2500")
    finally:
        timer.join()
        for agent in started:
            agent.close()
    assert codes(steps) == [OK, OK]
    assert "node agent unreachable" in stderr and "registered with the node agent" in stderr
    assert len(started[0].requests) == 1


def test_an_agent_slower_than_one_try_is_waited_for_longer(tc: Toolchain, work: Path) -> None:
    """An agent busy with other connections answers after 500 ms: later tries wait longer."""
    def slow(_request: dict[str, object]) -> bytes:
        time.sleep(0.5)
        return b'{"v":1,"ok":true}\n'

    agent = FakeAgent(work / "agent.sock", slow)
    try:
        steps, stderr = run_probe(tc, registering_env(tc, work, work / "agent.sock"), "symbol", "alloc:1g",
                                  "sleep:3000")
    finally:
        agent.close()
    assert codes(steps) == [OK, OK]
    assert "did not answer the registration in 200 ms" in stderr
    assert "registered with the node agent" in stderr


def test_a_refusal_is_not_asked_again(tc: Toolchain, work: Path) -> None:
    refusing = FakeAgent(work / "agent.sock", replying(b'{"v":1,"ok":false,"reason":"unknown token"}\n'))
    try:
        run_probe(tc, registering_env(tc, work, work / "agent.sock"), "symbol", "alloc:1g", "sleep:1000")
    finally:
        refusing.close()
    assert len(refusing.requests) == 1


def test_a_busy_socket_is_asked_again_until_the_agent_registers(tc: Toolchain, work: Path) -> None:
    """The agent's "busy with silent connections" refusal carries retry: the library asks again (it
    gave up at the first one, so a flood of idle connections kept containers unregistered)."""
    answers = iter([b'{"v":1,"ok":false,"reason":"busy; connect again","retry":true}\n'] * 2)
    busy_then_ok = FakeAgent(work / "agent.sock", lambda _r: next(answers, b'{"v":1,"ok":true}\n'))
    try:
        steps, stderr = run_probe(tc, registering_env(tc, work, work / "agent.sock"), "symbol", "alloc:1g",
                                  "sleep:3000")
    finally:
        busy_then_ok.close()
    assert codes(steps) == [OK, OK]
    assert len(busy_then_ok.requests) == 3
    assert "registered with the node agent" in stderr


def test_a_registered_process_renews_at_the_interval_the_agent_asks(tc: Toolchain, work: Path) -> None:
    """The heartbeat: with ``renewS`` in the reply the same line comes again every that many seconds,
    logged once (renewals are quiet)."""
    agent = FakeAgent(work / "agent.sock", replying(b'{"v":1,"ok":true,"renewS":1}\n'))
    try:
        steps, stderr = run_probe(tc, registering_env(tc, work, work / "agent.sock"), "symbol", "alloc:1g",
                                  "sleep:3500")
    finally:
        agent.close()
    assert codes(steps) == [OK, OK]
    assert 3 <= len(agent.requests) <= 5, agent.requests  # the first, then about one a second
    assert all(r == agent.requests[0] for r in agent.requests)
    assert stderr.count("registered with the node agent") == 1
    assert "renewing every 1 s" in stderr


def test_a_refused_renewal_ends_the_renewals(tc: Toolchain, work: Path) -> None:
    answers = iter([b'{"v":1,"ok":true,"renewS":1}\n'])
    agent = FakeAgent(work / "agent.sock", lambda _r: next(answers, b'{"v":1,"ok":false,"reason":"unknown token"}\n'))
    try:
        run_probe(tc, registering_env(tc, work, work / "agent.sock"), "symbol", "alloc:1g", "sleep:3500")
    finally:
        agent.close()
    assert len(agent.requests) == 2  # the registration, one renewal refused, then nothing


def test_without_renew_s_a_process_registers_once(tc: Toolchain, work: Path, agent: FakeAgent) -> None:
    run_probe(tc, registering_env(tc, work, work / "agent.sock"), "symbol", "alloc:1g", "sleep:2500")
    assert len(agent.requests) == 1
