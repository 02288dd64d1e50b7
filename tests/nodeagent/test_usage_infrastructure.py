"""The agent's usage pages show infrastructure holders (issues 26/27): counted among a card's holders
and marked, so an admin sees that nvidia-persistenced (or the GPU Operator's DCGM exporter pod) holds
the card although it stays free; an infrastructure pod has no container row (it has no share to
measure against)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpupool.api.usage_report import NodeUsageReport, decode_usage_report
from gpupool.nodeagent.metrics import metrics_app
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind
from gpupool.nodeagent.monitor.usage_state import ProcessIdentity
from tests.nodeagent import usage_world
from tests.nodeagent.monitor.fake_processes import FakeProcesses
from tests.nodeagent.usage_world import agent_with_monitor


@pytest.mark.parametrize("who", [
    pytest.param(ProcessIdentity(infrastructure="nvidia-persistenced"), id="host-daemon"),
    pytest.param(ProcessIdentity("c50", "exporter", "dcgm-exporter", "gpu-operator", "gpu-operator"),
                 id="infrastructure-pod"),
])
def test_the_usage_pages_count_and_mark_infrastructure_holders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               who: ProcessIdentity) -> None:
    monkeypatch.setitem(usage_world.WHO, 50, who)

    async def main() -> tuple[str, NodeUsageReport]:
        agent, monitor, source = agent_with_monitor(tmp_path)
        try:
            processes = cast(FakeProcesses, monitor.recorder._processes)  # the scripted table the world built
            processes.spawn(50, "/dev/nvidia0", "/dev/nvidia1")
            for path in ("/dev/nvidia0", "/dev/nvidia1"):
                source.emit(DeviceEvent(EventKind.OPEN, path, 50, 45.0))
            await agent.pre_start("", [])
            await monitor.step()
            async with TestClient(TestServer(metrics_app(agent))) as client:
                table = await (await client.get("/usage")).text()
                report = decode_usage_report(await (await client.get("/usage.json")).text())
        finally:
            monitor.stop()
        return table, report

    table, report = asyncio.run(main())
    assert [(c.holders, c.infrastructure_holders) for c in report.cards] == [(2, 1), (2, 1)]
    assert table.count("2 (1i)") == 2
    assert [(c.pod, c.card) for c in report.containers] == [("job-0", 0), ("rogue", 1)]
