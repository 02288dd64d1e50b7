"""Registration as the container's heartbeat: renewals recorded, rate-limited, ages per container."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.shim_contract import (
    RegisterReply,
    RegisterRequest,
    ShimProtocolError,
    decode_reply,
    encode_reply,
)
from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime
from gpupool.nodeagent.isolation.backends import EnforcementState, IsolationBackend
from gpupool.nodeagent.isolation.report import IsolationCollector, isolation_table
from gpupool.nodeagent.isolation.shim_registry import Heartbeat, ShimRegistry
from tests.nodeagent.isolation.test_shim_registry import TOKEN, UID, FakeProc

OTHER_TOKEN = "cd" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


def registry(proc: FakeProc, clock: Clock, heartbeat_s: int = 10) -> ShimRegistry:
    reg = ShimRegistry(lambda _pid: CgroupIdentity(Runtime.UNKNOWN, reason="none"), None, str(proc.root), clock=clock,
                       heartbeat_s=heartbeat_s)
    reg.issue(TOKEN, UID, "main", "ns", "p")
    return reg


def request(token: str = TOKEN) -> RegisterRequest:
    return RegisterRequest(token, 7, "ns/p", "main")


def test_the_reply_asks_for_renewals_and_a_renewal_moves_the_heartbeat(proc: FakeProc) -> None:
    clock = Clock()
    proc.start(40, 1)
    reg = registry(proc, clock)
    assert reg.register(request(), 40) == RegisterReply(True, renew_s=10)
    clock.now += 25
    assert reg.heartbeats() == {("ns", "p", "main"): Heartbeat(1, 25.0, False)}
    assert reg.register(request(), 40).renew_s == 10
    assert reg.stats.accepted == 1 and reg.stats.renewed == 1  # a renewal is not a second registration
    clock.now += 4
    assert reg.heartbeats()[("ns", "p", "main")] == Heartbeat(1, 4.0, False)


def test_a_process_that_stops_renewing_goes_stale_after_three_intervals(proc: FakeProc) -> None:
    clock = Clock()
    proc.start(40, 1)
    proc.start(41, 1)
    reg = registry(proc, clock)
    reg.register(request(), 40)
    reg.register(request(), 41)
    for _ in range(4):  # 41 keeps renewing, 40 is frozen
        clock.now += 10
        reg.register(request(), 41)
    beat = reg.heartbeats()[("ns", "p", "main")]
    assert beat == Heartbeat(2, 40.0, True)  # the stalest process's age: one frozen process is enough
    assert reg.stale_after_s == 30.0


def test_renewals_sooner_than_half_the_interval_are_answered_but_not_recorded(proc: FakeProc) -> None:
    clock = Clock()
    proc.start(40, 1)
    reg = registry(proc, clock)
    reg.register(request(), 40)
    proc.end(40)  # a throttled renewal reads nothing in /proc: it would have been refused otherwise
    clock.now += 4
    for _ in range(100):
        assert reg.register(request(), 40).ok
    assert reg.stats.throttled == 100 and reg.stats.renewed == 0
    proc.start(40, 1)
    assert reg.heartbeats()[("ns", "p", "main")].age_s == 4.0


def test_a_forged_token_renews_nothing(proc: FakeProc) -> None:
    clock = Clock()
    proc.start(40, 1)
    reg = registry(proc, clock)
    reg.register(request(), 40)
    clock.now += 20
    reply = reg.register(request(OTHER_TOKEN), 40)
    assert not reply.ok and reply.renew_s is None
    assert reg.heartbeats()[("ns", "p", "main")].age_s == 20.0


def test_a_reused_pid_is_a_new_registration_not_a_renewal(proc: FakeProc) -> None:
    clock = Clock()
    proc.start(40, 1)
    reg = registry(proc, clock)
    reg.register(request(), 40)
    clock.now += 20
    proc.start(40, 2)  # another process under the same pid
    reg.register(request(), 40)
    assert reg.stats.accepted == 2 and reg.stats.renewed == 0
    assert reg.processes(UID, "main")[0].start_time == 2


def test_an_ended_container_is_forgotten_and_exited_processes_pruned(proc: FakeProc) -> None:
    clock = Clock()
    proc.start(40, 1)
    reg = registry(proc, clock)
    reg.register(request(), 40)
    proc.end(40)
    clock.now += 100
    assert reg.heartbeats() == {("ns", "p", "main"): Heartbeat(0, 0.0, False)}
    reg.forget((UID, "main"))
    assert reg.heartbeats() == {}
    assert not reg.register(request(), 40).ok  # its token is gone with it


def test_the_interval_is_bounded() -> None:
    for bad in (0, 3601):
        with pytest.raises(ValueError):
            ShimRegistry(lambda _pid: CgroupIdentity(Runtime.UNKNOWN), heartbeat_s=bad)


def test_renew_s_on_the_wire() -> None:
    line = encode_reply(RegisterReply(True, host_pid=5, renew_s=10))
    assert line == b'{"v":1,"ok":true,"hostPid":5,"renewS":10}\n'
    assert decode_reply(line) == RegisterReply(True, "", 5, 10)
    assert b"renewS" not in encode_reply(RegisterReply(False, "no", renew_s=10))
    for bad in (b'{"v":1,"ok":true,"renewS":0}', b'{"v":1,"ok":true,"renewS":"10"}',
                b'{"v":1,"ok":true,"renewS":9999}'):
        with pytest.raises(ShimProtocolError):
            decode_reply(bad)


def test_metrics_and_the_usage_section_show_each_containers_heartbeat(proc: FakeProc) -> None:
    clock = Clock()
    proc.start(40, 1)
    reg = registry(proc, clock)
    reg.issue(OTHER_TOKEN, "uid-idle", "side", "ns", "idle")
    reg.register(request(), 40)
    clock.now += 31
    agent = SimpleNamespace(node="n1", inventory=SimpleNamespace(cards=[]),
                            enforcement=SimpleNamespace(registry=reg, state=lambda: EnforcementState(
                                IsolationBackend.SHIM, True)))
    metrics = CollectorRegistry()
    metrics.register(IsolationCollector(agent))  # type: ignore[arg-type]
    text = generate_latest(metrics).decode()
    values = {(s.name, s.labels.get("pod", "")): s.value for f in text_string_to_metric_families(text)
              for s in f.samples}
    assert values[("gpupool_container_heartbeat_age_seconds", "p")] == 31.0
    assert values[("gpupool_container_heartbeat_stale", "p")] == 1.0
    assert values[("gpupool_container_heartbeat_age_seconds", "idle")] == 0.0  # nothing registered: nothing stale
    assert values[("gpupool_container_heartbeat_stale", "idle")] == 0.0
    table = isolation_table(agent)  # type: ignore[arg-type]
    row = next(line for line in table.splitlines() if "ns/p/main" in line)
    assert row.split()[1:] == ["1", "31", "STALE"]
    assert "stale after 30 s" in table
