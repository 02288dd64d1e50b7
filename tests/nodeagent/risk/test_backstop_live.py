"""The over-grant backstop end to end: real processes on stand-in device files, the real usage
monitor (/proc scan) sampling the fake NVML backend's ``usage`` script, the risk loop, the responder.

The backends are stand-ins that report themselves enforcing (the point of a backstop: the limit was
got past anyway, by a static binary or a written-down account, which the driver's figures show).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpupool.api.shim_contract import RegisterRequest
from gpupool.core.model import CardSlice
from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime
from gpupool.nodeagent.isolation.backends import EnforcementState, IsolationBackend
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry
from gpupool.nodeagent.monitor.service import SAMPLE_EVERY_SECONDS, MonitorConfig, UsageMonitor
from gpupool.nodeagent.monitor.source_selector import SourceChoice
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.risk.findings import RiskAction, RiskKind
from gpupool.nodeagent.risk.regions import RegionReader
from gpupool.nodeagent.risk.responder import RiskResponder
from gpupool.nodeagent.risk.service import CHECK_EVERY_S, RiskMonitor
from gpupool.nodeagent.usage_monitor import BackendSampler
from gpupool.shim.region import SIZE as REGION_SIZE
from gpupool.testing.node_workload import fake_gpu_file
from gpupool.testing.shim_regions import region_path, write_region
from tests.nodeagent.monitor.children import WAIT_SECONDS, HoldingChild, stand_in
from tests.nodeagent.risk.test_risk_live import Containers, StandInAgent, scan, wait_for_holder
from tests.nodeagent.risk.world import pod

OVER_AT_S = 2.0
"""When the usage script has the trainer go past its grant (seconds after the first sample)."""


@dataclass
class Enforcing:
    """A backend that says it enforces (``registry``: the library's, where it is the library)."""

    backend: IsolationBackend
    registry: ShimRegistry | None = None

    def state(self) -> EnforcementState:
        return EnforcementState(self.backend, True)


@dataclass
class Events:
    posted: list[tuple[str, str, str, str, float]] = field(default_factory=list)
    evicted: list[tuple[str, str, float]] = field(default_factory=list)

    async def post(self, namespace: str, pod_name: str, reason: str, message: str) -> None:
        self.posted.append((namespace, pod_name, reason, message, time.time()))

    async def evict(self, namespace: str, pod_name: str) -> None:
        self.evicted.append((namespace, pod_name, time.time()))


def backend_with(usage: list[dict[str, Any]]) -> FakeGpuBackend:
    """Two 16 GiB fake cards whose NVML figures replay ``usage`` from the first sample on."""
    return FakeGpuBackend.from_dict({**fake_gpu_file(2, memory_mib=16384), "usage": usage})


def monitor_of(tmp_path: Path, backend: FakeGpuBackend, containers: Containers) -> tuple[UsageMonitor, list[str]]:
    devices = [stand_in(str(tmp_path), f"nvidia{i}") for i in range(2)]
    monitor = UsageMonitor("n1", {d: i for i, d in enumerate(devices)}, (), BackendSampler(backend),
                           MonitorConfig(str(tmp_path / "state.json")), identify=containers.identify,
                           choose=lambda paths: SourceChoice(scan(paths), "test"))
    monitor.start()
    return monitor, devices


@pytest.mark.slow
def test_a_container_past_its_grant_under_an_enforcing_backend_is_evicted_within_the_check_interval(
        tmp_path: Path) -> None:
    containers, events = Containers(), Events()
    devices = [stand_in(str(tmp_path), f"nvidia{i}") for i in range(2)]
    with HoldingChild(devices[0]) as trainer, HoldingChild(devices[0]) as neighbour:
        containers.put(trainer.pid, "train", "main")
        containers.put(neighbour.pid, "web", "app")
        backend = backend_with([  # the neighbour holds more than the trainer's grant, within its own, all along
            {"at": 0, "card": 0, "processes": [{"pid": trainer.pid, "memoryMiB": 4000},
                                               {"pid": neighbour.pid, "memoryMiB": 9000}]},
            {"at": OVER_AT_S, "card": 0, "processes": [{"pid": trainer.pid, "memoryMiB": 12000},
                                                       {"pid": neighbour.pid, "memoryMiB": 9000}]}])
        monitor, _ = monitor_of(tmp_path, backend, containers)
        agent = StandInAgent([pod("train", {"main": (CardSlice(0, 4096, 300),)}),
                              pod("web", {"app": (CardSlice(0, 10240, 300),)})], backend.inventory(),
                             enforcement=Enforcing(IsolationBackend.MPS))  # type: ignore[arg-type]
        checks = RiskMonitor(agent, monitor, RiskResponder(RiskAction.EVICT, events.post,  # type: ignore[arg-type]
                                                           evict=events.evict))
        try:
            wait_for_holder(monitor, devices[0], trainer.pid)
            wait_for_holder(monitor, devices[0], neighbour.pid)

            async def run() -> float:
                started = time.time()  # the script starts at the monitor's first sample, right below
                tasks = [asyncio.create_task(monitor.run()), asyncio.create_task(checks.run())]
                try:
                    while not events.evicted and time.time() - started < OVER_AT_S + 4 * CHECK_EVERY_S:
                        await asyncio.sleep(0.05)
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                return started

            started = asyncio.run(run())
        finally:
            monitor.stop()
    assert [(ns, name) for ns, name, _ in events.evicted] == [("team", "train")]  # never the neighbour
    delay = events.evicted[0][2] - (started + OVER_AT_S)
    print(f"over-grant to eviction: {delay:.2f} s")
    assert delay <= SAMPLE_EVERY_SECONDS + CHECK_EVERY_S + 0.5, f"took {delay:.2f} s"
    [(_, _, reason, message, _)] = events.posted
    assert reason == "GpuRiskOverMemory" and "use 12000 MiB, above the grant's 4096 MiB" in message
    assert "got past it" in message and "the pod is evicted" in message


def test_a_region_zeroed_while_the_driver_shows_usage_is_the_tamper_risk(tmp_path: Path) -> None:
    containers, events = Containers(), Events()
    state_dir = tmp_path / "state"
    devices = [stand_in(str(tmp_path), f"nvidia{i}") for i in range(2)]
    registry = ShimRegistry(lambda pid: CgroupIdentity(Runtime.UNKNOWN, reason="a test process"))
    token = "ab" * 32
    registry.issue(token, "uid-train", "main", "team", "train")
    with HoldingChild(devices[0]) as trainer:
        containers.put(trainer.pid, "train", "main")
        assert registry.register(RegisterRequest(token, 7, "team/train", "main"), trainer.pid).ok
        backend = backend_with([{"at": 0, "card": 0, "processes": [{"pid": trainer.pid, "memoryMiB": 6300}]}])
        monitor, _ = monitor_of(tmp_path, backend, containers)
        agent = StandInAgent([pod("train", {"main": (CardSlice(0, 8192, 300),)})], backend.inventory(),
                             enforcement=Enforcing(IsolationBackend.SHIM, registry))  # type: ignore[arg-type]
        checks = RiskMonitor(agent, monitor, RiskResponder(RiskAction.REPORT, events.post),  # type: ignore[arg-type]
                             regions=RegionReader(str(state_dir)))
        write_region(state_dir, "uid-train", {0: (6000, 0)}, container="main")  # the library's true account

        async def rounds() -> list[list[tuple[RiskKind, str]]]:
            seen = []
            for zeroed in (False, True, True):
                if zeroed:  # the container writes its counters down
                    write_region(state_dir, "uid-train", {0: (0, 0)}, container="main")
                await asyncio.sleep(0.01)  # a later sample time
                await monitor.step()
                seen.append([(r.kind, r.pod) for r in await checks.step()])
            region_path(state_dir, "uid-train", "main").write_bytes(bytes(REGION_SIZE))  # the whole file zeroed
            await monitor.step()
            seen.append([(r.kind, r.pod) for r in await checks.step()])  # still the same risk: nothing new
            return seen

        try:
            wait_for_holder(monitor, devices[0], trainer.pid)
            assert asyncio.run(rounds()) == [[], [], [(RiskKind.REGION_TAMPERED, "train")], []]
        finally:
            monitor.stop()
    [(namespace, name, reason, message, _)] = events.posted
    assert (namespace, name, reason) == ("team", "train", "GpuRiskRegionTampered")
    assert "0 MiB in its accounting region" in message and "reports 6300 MiB" in message


def test_nvml_errors_and_vanished_processes_never_crash_the_check_nor_report(tmp_path: Path) -> None:
    containers, events = Containers(), Events()
    state_dir = tmp_path / "state"
    devices = [stand_in(str(tmp_path), f"nvidia{i}") for i in range(2)]
    gone = HoldingChild(devices[0])
    containers.put(gone.pid, "train", "main")
    backend = backend_with([{"at": 0, "card": 0, "processes": [{"pid": gone.pid, "memoryMiB": 15000}]}])
    monitor, _ = monitor_of(tmp_path, backend, containers)
    registry = ShimRegistry(lambda pid: CgroupIdentity(Runtime.UNKNOWN, reason="a test process"))
    agent = StandInAgent([pod("train", {"main": (CardSlice(0, 4096, 300),)})], backend.inventory(),
                         enforcement=Enforcing(IsolationBackend.SHIM, registry))  # type: ignore[arg-type]
    checks = RiskMonitor(agent, monitor, RiskResponder(RiskAction.REPORT, events.post),  # type: ignore[arg-type]
                         regions=RegionReader(str(state_dir)))  # no region file at all: unreadable

    def nvml_lost() -> Any:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    async def rounds() -> list[list[RiskKind]]:
        seen = []
        wait_for_holder(monitor, devices[0], gone.pid)
        gone.end()  # the process exits; the driver's list still names it (it lags)
        deadline = time.monotonic() + WAIT_SECONDS
        while monitor.state.device(devices[0]).holders and time.monotonic() < deadline:  # type: ignore[union-attr]
            monitor.recorder.prune()  # the monitor's loop does it every 30 s; a close the source saw, at once
            await asyncio.sleep(0.05)
        await monitor.step()
        seen.append([r.kind for r in await checks.step()])
        backend.sample_usage = nvml_lost  # type: ignore[method-assign]
        await monitor.step()
        seen.append([r.kind for r in await checks.step()])
        return seen

    try:
        assert asyncio.run(rounds()) == [[], []]
    finally:
        monitor.stop()
    assert monitor.sample_errors == 1 and events.posted == []


def test_the_region_reader_reads_by_card_and_says_nothing_of_a_missing_file(tmp_path: Path) -> None:
    reader = RegionReader(str(tmp_path))
    write_region(tmp_path, "uid-a", {0: (1000, 0), 1: (3000, 0)}, container="main")
    assert reader.use("uid-a", "main", (3, 1)) == {3: 1000, 1: 3000}  # ordinal i is the i-th slice's card
    region_path(tmp_path, "uid-a", "main").write_bytes(b"\0" * 100)  # truncated from inside
    assert reader.use("uid-a", "main", (3, 1)) == {3: 0, 1: 0}
    assert reader.use("uid-b", "main", (0,)) is None
    assert reader.use("bad_uid", "main", (0,)) is None
