"""A lending service over stand-ins: scripted processes, a recording API, the fake monitor."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from gpupool.nodeagent.containers.container_gate import ContainerGate
from gpupool.nodeagent.device_layout import DeviceLayout
from gpupool.nodeagent.lending.options import ActivityThresholds
from gpupool.nodeagent.lending.pods import LendingPods
from gpupool.nodeagent.lending.processes import PodProcesses
from gpupool.nodeagent.lending.publisher import LendablePublisher
from gpupool.nodeagent.lending.reclaim import Reclaimer, StoppedHook
from gpupool.nodeagent.lending.service import LendingConfig, LendingService
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind
from gpupool.nodeagent.monitor.usage_sampling import CardUsage, ProcessUsage, UsageSample
from gpupool.nodeagent.monitor.usage_state import DeviceState, ProcessIdentity
from tests.nodeagent.lending.support import CARD_MIB, LEND, NAMES, FakeMonitor, decoded, holder, inventory, pod_json

CARD0, CARD1 = "/dev/nvidia0", "/dev/nvidia1"


class Processes:
    """Scripted container processes: pid → container ID; a signalled process exits at once."""

    def __init__(self) -> None:
        self.alive: dict[int, str] = {}
        self.sent: list[tuple[int, str]] = []
        self.container_inits: set[int] = set()
        """Processes that are process 1 of their container's pid namespace."""

    def pids(self, target: PodProcesses) -> set[int]:
        return {p for p, c in self.alive.items() if c in target.container_ids}

    def send(self, pid: int, sig: Any) -> None:
        self.sent.append((pid, sig.name))
        container = self.alive.pop(pid, None)
        if pid in self.container_inits:  # criu-run as process 1 dumps, and so ends, its whole container
            self.alive = {p: c for p, c in self.alive.items() if c != container}

    def inits(self, pids: set[int]) -> set[int]:
        return pids & self.container_inits


class Api:
    def __init__(self) -> None:
        self.evicted: list[tuple[str, str]] = []
        self.annotations: list[str | None] = []

    async def evict(self, namespace: str, name: str) -> str:
        self.evicted.append((namespace, name))
        return "evicted"

    async def warn(self, namespace: str, name: str, reason: str, message: str) -> None:
        return None

    async def write(self, value: str | None) -> None:
        self.annotations.append(value)


class World:
    def __init__(self, tmp: Path, pods: list[dict[str, Any]]) -> None:
        self.monitor = FakeMonitor(str(tmp / "state.json"))
        self.pods = LendingPods(LEND)
        self.pods.on_list(decoded(*pods))
        self.processes = Processes()
        self.api = Api()
        self.device_bumps = 0
        self.tmp = tmp
        self.identities: dict[int, ProcessIdentity] = {}
        """Pids the service's resolver names otherwise than by the pid's hundreds (below)."""

    def service(self, activity: ActivityThresholds | None = None, shim_state_dir: str | None = None,
                gate: ContainerGate | None = None) -> LendingService:
        async def bump() -> None:
            self.device_bumps += 1

        def reclaimer(on_stopped: StoppedHook) -> Reclaimer:
            return Reclaimer(self.processes, self.api, on_stopped=on_stopped, poll_s=0.01)

        def identify(pid: int) -> ProcessIdentity:
            if pid in self.identities:
                return self.identities[pid]
            pod = f"p{pid // 100}" if pid // 100 else ""
            names = {1: "owner", 2: "borrower", 3: "owner1", 4: "borrower1", 5: "other"}
            name = names.get(pid // 100, "")
            return ProcessIdentity(f"id-{name}", "c", name, "ns") if name and pod else ProcessIdentity()

        return LendingService(self.monitor, inventory, DeviceLayout(NAMES), self.pods, reclaimer,
                              LendablePublisher(self.api.write, min_interval_s=0), bump,
                              LendingConfig(str(self.tmp / "lending.json"), deadline_s=1,
                                            activity=activity or ActivityThresholds(),
                                            shim_state_dir=shim_state_dir), identify, gate)

    def started(self, activity: ActivityThresholds | None = None, shim_state_dir: str | None = None,
                gate: ContainerGate | None = None) -> LendingService:
        """:meth:`service`, started on the running event loop (call it inside the test's body)."""
        service = self.service(activity, shim_state_dir, gate)
        service.start(asyncio.get_running_loop())
        return service


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


async def settle(service: LendingService) -> None:
    for _ in range(50):
        await asyncio.sleep(0.01)
        if not service.reclaimer.in_flight:
            break
    await asyncio.sleep(0.02)


def idle_owner(world: World, path: str = CARD0, owner: str = "owner", pid: int = 100) -> None:
    world.monitor.hold(path, holder(owner, pid), state=DeviceState.IDLE)
    world.monitor.sample({0: 2048, 1: 2048})


PODS = [pod_json("owner", cards=(0,)), pod_json("borrower", borrowed_from="ns/owner", cards=(0,)),
        pod_json("owner1", cards=(1,)), pod_json("borrower1", borrowed_from="ns/owner1", cards=(1,)),
        pod_json("other", priority=2000)]


def open_(pid: int, path: str = CARD0) -> DeviceEvent:
    return DeviceEvent(EventKind.OPEN, path, pid, 0.0)


def tick(world: World, util: dict[int, int] | None = None,
         processes: dict[int, tuple[ProcessUsage, ...]] | None = None) -> None:
    """The monitor's next usage sample (one second after the last): card utilisation and NVML processes."""
    last = world.monitor.last_sample
    world.monitor.last_sample = UsageSample((last.time if last else 0.0) + 1.0, tuple(
        CardUsage(i, (util or {}).get(i, 0), 2048, CARD_MIB, (processes or {}).get(i, ()))
        for i in sorted(world.monitor.cards.values())))
