"""The usage monitor on the agent's HTTP server: per-card and per-container series on ``/metrics``,
the ``/usage`` table, and busy/idle changes as events on the holding pods."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.usage_report import NodeUsageReport, decode_usage_report
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.metrics import metrics_app
from gpupool.nodeagent.monitor.service import StateChange
from gpupool.nodeagent.monitor.usage_state import DeviceState, Holder
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.usage_monitor import BUSY_REASON, IDLE_REASON, pod_event_listener
from tests.nodeagent.harness import NAMES
from tests.nodeagent.usage_world import GPUS, NODE, Pods, agent_with_monitor

MIB = 1 << 20


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
            monitor.recorder.released = 3  # as if prune had dropped three exited holders
            async with TestClient(TestServer(metrics_app(agent))) as client:
                text = await (await client.get("/metrics")).text()
                table = await (await client.get("/usage")).text()
        finally:
            monitor.stop()
        got = samples(text)
        assert got["gpupool_card_utilization_ratio"] == {card(0): 0.5, card(1): 0}
        assert got["gpupool_card_memory_used_bytes"] == {card(0): 3500 * MIB, card(1): 0}
        assert got["gpupool_card_holders"] == {card(0): 1, card(1): 1}
        assert got["gpupool_card_idle_seconds"] == {card(0): 0, card(1): 0}
        assert got["gpupool_card_state"][card(0, state="busy")] == 1
        assert got["gpupool_card_state"][card(0, state="free")] == 0
        job, rogue = container("job-0", "train", 0), container("rogue", "x", 1)
        assert got["gpupool_container_memory_used_bytes"] == {job: 3000 * MIB, rogue: 0}  # pid 999 holds no device
        assert got["gpupool_container_memory_limit_bytes"] == {job: 4096 * MIB, rogue: 0}  # rogue: no grant
        assert got["gpupool_container_sm_utilization_ratio"] == {job: 0.4, rogue: 0}
        assert got["gpupool_container_compute_share_ratio"] == {job: 0.3, rogue: 0}
        assert got["gpupool_monitor_holders_released_total"] == {(): 3}
        # every card and state from the first scrape, at 0 until it happens (increase() sees the first)
        changes = got["gpupool_card_state_changes_total"]
        assert set(changes) == {card(i, state=s) for i in (0, 1) for s in ("busy", "idle")}
        assert set(changes.values()) == {0}
        assert got["gpupool_monitor_source_info"] == {(("node", NODE), ("source", "scripted")): 1}
        assert "ml/job-0/train" in table and "3000/4096" in table and "40/30" in table
        assert "ml/rogue/x" in table and "busy" in table

    asyncio.run(main())


def test_usage_json_is_the_same_report_for_programs(tmp_path: Path) -> None:
    async def main() -> NodeUsageReport:
        agent, monitor, _ = agent_with_monitor(tmp_path)
        try:
            await agent.pre_start("", [])
            await monitor.step()
            async with TestClient(TestServer(metrics_app(agent))) as client:
                response = await client.get("/usage.json")
                assert response.content_type == "application/json"
                return decode_usage_report(await response.text())
        finally:
            monitor.stop()

    report = asyncio.run(main())
    assert (report.node, report.source, report.idle_after_seconds) == (NODE, "scripted", 600.0)
    assert [(c.uuid, c.state, c.utilization_percent, c.memory_used_mib, c.memory_total_mib, c.holders)
            for c in report.cards] == [("GPU-0", "busy", 50, 3500, 16384, 1), ("GPU-1", "busy", 0, 0, 16384, 1)]
    assert [(c.pod, c.container, c.card, c.memory_used_mib, c.memory_limit_mib, c.sm_percent,
             c.compute_share_percent) for c in report.containers] == [
        ("job-0", "train", 0, 3000, 4096, 40, 30), ("rogue", "x", 1, 0, 0, 0, 0)]


def test_usage_is_404_when_the_monitor_is_off(tmp_path: Path) -> None:
    async def main() -> None:
        pods = Pods()
        agent = NodeAgent(NODE, NAMES, FakeGpuBackend.from_dict(GPUS), pods, pods, lambda *a: "")
        async with TestClient(TestServer(metrics_app(agent))) as client:
            response = await client.get("/usage")
            assert response.status == 404 and "--no-usage-monitor" in await response.text()
            response = await client.get("/usage.json")
            assert response.status == 404 and "--no-usage-monitor" in (await response.json())["error"]
            assert "gpupool_card_utilization_ratio" not in await (await client.get("/metrics")).text()

    asyncio.run(main())


def test_a_state_change_is_an_event_on_each_holding_pod() -> None:
    posted: list[tuple[str, str, str, str]] = []

    async def post(*event: str) -> None:
        posted.append(event)  # type: ignore[arg-type]

    holders = (Holder(1, 1, 0.0, "c1", "a", "p1", "ml"), Holder(2, 1, 0.0, "c2", "b", "p1", "ml"),
               Holder(3, 1, 0.0, "c3", "m", "p2", "ml"), Holder(4, 1, 0.0),  # pid 4: no pod, no event
               Holder(5, 1, 0.0, "c5", "e", "dcgm", "ops", infrastructure="ops"))  # an infrastructure pod: none
    listener = pod_event_listener(post, 600.0)
    asyncio.run(listener(StateChange("/dev/nvidia0", 0, DeviceState.BUSY, DeviceState.IDLE, holders, 1.0)))
    asyncio.run(listener(StateChange("/dev/nvidia0", 0, DeviceState.IDLE, DeviceState.BUSY, holders[2:], 2.0)))
    assert [(ns, pod, reason) for ns, pod, reason, _ in posted] == [
        ("ml", "p1", IDLE_REASON), ("ml", "p2", IDLE_REASON), ("ml", "p2", BUSY_REASON)]
    assert "GPU 0 (/dev/nvidia0) idle: no SM activity for 600 s while held by a (pid 1), b (pid 2)" in posted[0][3]


