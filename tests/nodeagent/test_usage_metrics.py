"""The usage monitor on the agent's HTTP server: per-card and per-container series on ``/metrics``,
the ``/usage`` table, and busy/idle changes as events on the holding pods."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.metrics import metrics_app
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind
from gpupool.nodeagent.monitor.service import MonitorConfig, StateChange, UsageMonitor
from gpupool.nodeagent.monitor.source_selector import SourceChoice
from gpupool.nodeagent.monitor.usage_state import DeviceState, Holder, ProcessIdentity
from gpupool.nodeagent.nvml.backend import CONTROL_DEVICES
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.types import NodeAssignment, PodResourcesSnapshot, PodView
from gpupool.nodeagent.usage_monitor import BUSY_REASON, IDLE_REASON, BackendSampler, card_paths, pod_event_listener
from tests.nodeagent.harness import NAMES
from tests.nodeagent.monitor.fake_processes import FakeProcesses
from tests.nodeagent.monitor.scripted_source import ScriptedSource

NODE = "node-a"
GPUS = {"model": "Tesla-T4", "cards": [{"uuid": "GPU-0", "memoryMiB": 16384}, {"uuid": "GPU-1", "memoryMiB": 16384}],
        "usage": [{"at": 0, "card": 0, "utilization": 50,
                   "processes": [{"pid": 100, "memoryMiB": 3000, "sm": 40}, {"pid": 999, "memoryMiB": 500}]}]}
WHO = {100: ProcessIdentity("c100", "train", "job-0", "ml"), 300: ProcessIdentity("c300", "x", "rogue", "ml")}


class Pods:
    """The pod source and PodResources of one assigned pod, ml/job-0 (train: 4 GiB, 30 % of card 0)."""

    view = PodView("ml", "job-0", "uid-0", NODE, 0.0, False, (), NodeAssignment(
        Placement("ml/job-0", NODE, 0, 0, (ContainerAssignment("train", (CardSlice(0, 4096, 300),)),)),
        {0: "GPU-0"}))

    async def get(self, namespace: str, name: str) -> PodView | None:
        return self.view if (namespace, name) == self.view.key else None

    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        pass

    async def list(self) -> PodResourcesSnapshot:
        return {self.view.key: {}}


def agent_with_monitor(tmp_path: Path) -> tuple[NodeAgent, UsageMonitor, ScriptedSource]:
    backend = FakeGpuBackend.from_dict(GPUS, clock=lambda: 50.0)
    source, processes = ScriptedSource(), FakeProcesses()

    def choose(paths: Sequence[str]) -> SourceChoice:
        return SourceChoice(source, "test")

    monitor = UsageMonitor(NODE, card_paths(backend.inventory()), CONTROL_DEVICES, BackendSampler(backend),
                           MonitorConfig(str(tmp_path / "state.json")), choose=choose, processes=processes,
                           identify=lambda pid: WHO[pid], clock=lambda: 50.0)
    monitor.start()
    for pid, path in ((100, "/dev/nvidia0"), (300, "/dev/nvidia1")):
        processes.spawn(pid, path)
        source.emit(DeviceEvent(EventKind.OPEN, path, pid, 40.0))
    pods = Pods()
    agent = NodeAgent(NODE, NAMES, backend, pods, pods, lambda *a: "", monitor=monitor)
    return agent, monitor, source


def samples(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def card(index: int, **extra: str) -> tuple[tuple[str, str], ...]:
    labels = {"node": NODE, "card": str(index), "uuid": f"GPU-{index}", "model": "Tesla-T4", **extra}
    return tuple(sorted(labels.items()))


def container(pod: str, name: str, index: int) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"node": NODE, "namespace": "ml", "pod": pod, "container": name, "card": str(index)}.items()))


def test_metrics_and_the_usage_table_show_each_card_and_container(tmp_path: Path) -> None:
    async def main() -> None:
        agent, monitor, _ = agent_with_monitor(tmp_path)
        try:
            await agent.pre_start("", [])  # reads PodResources and the pods, as the poller does
            await monitor.step()
            async with TestClient(TestServer(metrics_app(agent))) as client:
                text = await (await client.get("/metrics")).text()
                table = await (await client.get("/usage")).text()
        finally:
            monitor.stop()
        got = samples(text)
        assert got["gpupool_card_utilization_percent"] == {card(0): 50, card(1): 0}
        assert got["gpupool_card_memory_used_mib"] == {card(0): 3500, card(1): 0}
        assert got["gpupool_card_holders"] == {card(0): 1, card(1): 1}
        assert got["gpupool_card_idle_seconds"] == {card(0): 0, card(1): 0}
        assert got["gpupool_card_state"][card(0, state="busy")] == 1
        assert got["gpupool_card_state"][card(0, state="free")] == 0
        job, rogue = container("job-0", "train", 0), container("rogue", "x", 1)
        assert got["gpupool_container_memory_used_mib"] == {job: 3000, rogue: 0}  # pid 999 holds no device
        assert got["gpupool_container_memory_limit_mib"] == {job: 4096, rogue: 0}  # rogue: no grant
        assert got["gpupool_container_sm_utilization_percent"] == {job: 40, rogue: 0}
        assert got["gpupool_container_compute_share_percent"] == {job: 30, rogue: 0}
        assert got["gpupool_monitor_source_info"] == {(("node", NODE), ("source", "scripted")): 1}
        assert "ml/job-0/train" in table and "3000/4096" in table and "40/30" in table
        assert "ml/rogue/x" in table and "busy" in table

    asyncio.run(main())


def test_usage_is_404_when_the_monitor_is_off(tmp_path: Path) -> None:
    async def main() -> None:
        pods = Pods()
        agent = NodeAgent(NODE, NAMES, FakeGpuBackend.from_dict(GPUS), pods, pods, lambda *a: "")
        async with TestClient(TestServer(metrics_app(agent))) as client:
            response = await client.get("/usage")
            assert response.status == 404 and "--no-usage-monitor" in await response.text()
            assert "gpupool_card_utilization_percent" not in await (await client.get("/metrics")).text()

    asyncio.run(main())


def test_a_state_change_is_an_event_on_each_holding_pod() -> None:
    posted: list[tuple[str, str, str, str]] = []

    async def post(*event: str) -> None:
        posted.append(event)  # type: ignore[arg-type]

    holders = (Holder(1, 1, 0.0, "c1", "a", "p1", "ml"), Holder(2, 1, 0.0, "c2", "b", "p1", "ml"),
               Holder(3, 1, 0.0, "c3", "m", "p2", "ml"), Holder(4, 1, 0.0))  # pid 4: no pod, no event
    listener = pod_event_listener(post, 600.0)
    asyncio.run(listener(StateChange("/dev/nvidia0", 0, DeviceState.BUSY, DeviceState.IDLE, holders, 1.0)))
    asyncio.run(listener(StateChange("/dev/nvidia0", 0, DeviceState.IDLE, DeviceState.BUSY, holders[2:], 2.0)))
    assert [(ns, pod, reason) for ns, pod, reason, _ in posted] == [
        ("ml", "p1", IDLE_REASON), ("ml", "p2", IDLE_REASON), ("ml", "p2", BUSY_REASON)]
    assert "GPU 0 (/dev/nvidia0) idle: no SM activity for 600 s while held by a (pid 1), b (pid 2)" in posted[0][3]


