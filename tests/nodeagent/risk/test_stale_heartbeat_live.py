"""A registered process that stops renewing is found by the risk loop and acted on by the policy:
real processes on stand-in device files, the real usage monitor, the registry and the responder."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gpupool.api.shim_contract import RegisterRequest
from gpupool.core.model import CardSlice
from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime
from gpupool.nodeagent.isolation.backends import IsolationBackend
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry
from gpupool.nodeagent.risk.findings import RiskAction, RiskKind
from gpupool.nodeagent.risk.responder import RiskResponder
from gpupool.nodeagent.risk.service import RiskMonitor
from tests.nodeagent.monitor.children import HoldingChild, stand_in
from tests.nodeagent.risk.test_backstop_live import Enforcing, Events, backend_with, monitor_of
from tests.nodeagent.risk.test_risk_live import Containers, StandInAgent, wait_for_holder
from tests.nodeagent.risk.world import pod

TOKEN = "ab" * 32


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def test_a_holder_that_stops_renewing_is_evicted_by_policy_and_one_that_renews_is_not(tmp_path: Path) -> None:
    containers, events, clock = Containers(), Events(), Clock()
    devices = [stand_in(str(tmp_path), f"nvidia{i}") for i in range(2)]
    registry = ShimRegistry(lambda pid: CgroupIdentity(Runtime.UNKNOWN, reason="a test process"), clock=clock)
    registry.issue(TOKEN, "uid-train", "main", "team", "train")
    registry.issue("cd" * 32, "uid-web", "app", "team", "web")
    with HoldingChild(devices[0]) as frozen, HoldingChild(devices[0]) as alive:
        containers.put(frozen.pid, "train", "main")
        containers.put(alive.pid, "web", "app")
        assert registry.register(RegisterRequest(TOKEN, 7, "team/train", "main"), frozen.pid).ok
        assert registry.register(RegisterRequest("cd" * 32, 7, "team/web", "app"), alive.pid).ok
        backend = backend_with([{"at": 0, "card": 0, "processes": []}])
        monitor, _ = monitor_of(tmp_path, backend, containers)
        agent = StandInAgent([pod("train", {"main": (CardSlice(0, 4096, 300),)}),
                              pod("web", {"app": (CardSlice(0, 4096, 300),)})], backend.inventory(),
                             enforcement=Enforcing(IsolationBackend.SHIM, registry))  # type: ignore[arg-type]
        checks = RiskMonitor(agent, monitor, RiskResponder(RiskAction.EVICT, events.post,  # type: ignore[arg-type]
                                                           evict=events.evict), clock=clock)

        async def rounds() -> list[list[tuple[RiskKind, str]]]:
            seen = []
            for _ in range(4):  # 0, 10, 20, 30 s: within the stale age; then 40 s: past it
                await monitor.step()
                seen.append([(r.kind, r.pod) for r in await checks.step()])
                clock.now += 10
                assert registry.register(RegisterRequest("cd" * 32, 7, "team/web", "app"), alive.pid).ok
            await monitor.step()
            seen.append([(r.kind, r.pod) for r in await checks.step()])
            return seen

        try:
            wait_for_holder(monitor, devices[0], frozen.pid)
            wait_for_holder(monitor, devices[0], alive.pid)
            assert asyncio.run(rounds()) == [[], [], [], [], [(RiskKind.STALE_HEARTBEAT, "train")]]
        finally:
            monitor.stop()
    assert [(ns, name) for ns, name, _ in events.evicted] == [("team", "train")]
    [(namespace, name, reason, message, _)] = events.posted
    assert (namespace, name, reason) == ("team", "train", "GpuRiskStaleHeartbeat")
    assert f"pid {frozen.pid}" in message and "has not renewed for 40 s" in message
