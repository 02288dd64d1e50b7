"""A node agent with a usage monitor on a scripted event source and fake GPUs (tests only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind
from gpupool.nodeagent.monitor.service import MonitorConfig, UsageMonitor
from gpupool.nodeagent.monitor.source_selector import SourceChoice
from gpupool.nodeagent.monitor.usage_state import ProcessIdentity
from gpupool.nodeagent.nvml.backend import CONTROL_DEVICES
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.types import NodeAssignment, PodResourcesSnapshot, PodView
from gpupool.nodeagent.usage_monitor import BackendSampler, card_paths
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


def agent_with_monitor(tmp_path: Path, node: str = NODE) -> tuple[NodeAgent, UsageMonitor, ScriptedSource]:
    """An agent of ``node`` whose monitor has recorded pid 100 (ml/job-0/train) on card 0 and pid 300
    (ml/rogue/x, no grant) on card 1; the fake backend samples card 0 at 50 %."""
    backend = FakeGpuBackend.from_dict(GPUS, clock=lambda: 50.0)
    source, processes = ScriptedSource(), FakeProcesses()

    def choose(paths: Sequence[str]) -> SourceChoice:
        return SourceChoice(source, "test")

    monitor = UsageMonitor(node, card_paths(backend.inventory()), CONTROL_DEVICES, BackendSampler(backend),
                           MonitorConfig(str(tmp_path / "state.json")), choose=choose, processes=processes,
                           identify=lambda pid: WHO[pid], clock=lambda: 50.0,
                           ignore_pids=())  # pid 100 or 300 may be this process's own
    monitor.start()
    for pid, path in ((100, "/dev/nvidia0"), (300, "/dev/nvidia1")):
        processes.spawn(pid, path)
        source.emit(DeviceEvent(EventKind.OPEN, path, pid, 40.0))
    pods = Pods()
    agent = NodeAgent(node, NAMES, backend, pods, pods, lambda *a: "", monitor=monitor)
    return agent, monitor, source
