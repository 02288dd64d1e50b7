"""Risk checks with real processes on stand-in devices, the real monitor and a real event source.

A stand-in agent gives the pods' grants (what ``NodeAgent.listed_pods`` would); everything else is
the product: the usage monitor with the /proc scan or fanotify, its recorder, the detector, the
responder, the open decider chained into the source, and the agent's cordon through the fake
kubelet's ListAndWatch.
"""

from __future__ import annotations

import asyncio
import errno
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpupool.core.model import CardSlice
from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime
from gpupool.nodeagent.gpu_inventory import GpuInventory, HealthEvent
from gpupool.nodeagent.isolation.backends import NoEnforcement
from gpupool.nodeagent.monitor.events import EventSource
from gpupool.nodeagent.monitor.fanotify_source import FanotifySource
from gpupool.nodeagent.monitor.proc_scan_source import ProcScanSource
from gpupool.nodeagent.monitor.service import MonitorConfig, UsageMonitor
from gpupool.nodeagent.monitor.source_selector import SourceChoice, probe_fanotify
from gpupool.nodeagent.monitor.usage_sampling import CardUsage, ProcessUsage, UsageSample
from gpupool.nodeagent.monitor.usage_state import ProcessIdentity
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.risk.decider import RiskOpenDecider, chain_deciders
from gpupool.nodeagent.risk.detector import detect
from gpupool.nodeagent.risk.findings import RiskAction, RiskKind
from gpupool.nodeagent.risk.metrics import RiskCollector
from gpupool.nodeagent.risk.responder import RiskResponder
from gpupool.nodeagent.risk.service import GRANT_MEMORY_S, LIST_WAIT_S, RiskMonitor
from gpupool.nodeagent.types import PodView
from tests.nodeagent.harness import NAMES, running_node
from tests.nodeagent.monitor.children import WAIT_SECONDS, HoldingChild, stand_in
from tests.nodeagent.risk.world import pod
from tests.nodeagent.test_plugin_protocol import fake_gpu_file

_OPEN_ON_CUE = (
    "import os, sys\n"
    "print('started', flush=True)\n"
    "sys.stdin.readline()\n"
    "try:\n"
    "    os.close(os.open(sys.argv[1], os.O_RDONLY))\n"
    "    print(0, flush=True)\n"
    "except OSError as exc:\n"
    "    print(exc.errno, flush=True)\n"
)


class OpenOnCue:
    """A process whose pid is known before it opens ``path`` (so a test can place it in a container)."""

    def __init__(self, path: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _OPEN_ON_CUE, path], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.pid = self.process.pid
        assert self.process.stdout is not None and self.process.stdout.readline().strip() == "started"

    def open(self) -> int:
        """The errno the open failed with, 0 on success."""
        out, _ = self.process.communicate("\n", timeout=WAIT_SECONDS)
        return int(out.strip())


@dataclass
class StandInAgent:
    """What the risk checks read from the node agent: the listed pods and the enforcement."""

    pods: list[PodView]
    inventory: GpuInventory
    node: str = "n1"
    enforcement: NoEnforcement = field(default_factory=NoEnforcement)
    cordons: list[dict[int, str]] = field(default_factory=list)

    listed: bool = True
    """Whether the agent's first complete list of its pods is done (``live_pods`` is ``None`` before)."""
    claims_granted: Callable[[], list[PodView]] | None = None
    """The DRA driver's prepared claims, as the agent hands them on (None: no ``--dra``)."""

    def listed_pods(self) -> list[PodView]:
        return self.pods if self.listed else []

    def live_pods(self) -> dict[str, tuple[str, str]] | None:
        return {p.uid: (p.namespace, p.name) for p in self.pods} if self.listed else None

    async def cordon(self, cards: Mapping[int, str]) -> None:
        self.cordons.append(dict(cards))


class Sampler:
    """NVML's per-process memory, as the test sets it."""

    def __init__(self) -> None:
        self.memory: dict[int, dict[int, int]] = {}

    def sample(self) -> UsageSample:
        return UsageSample(time.time(), tuple(CardUsage(card, 90, sum(p.values()), 15360,
                                                        tuple(ProcessUsage(pid, mib) for pid, mib in p.items()))
                                              for card, p in self.memory.items()))


class Containers:
    """pid → (container ID, pod container), standing in for the cgroups and the pod watch."""

    def __init__(self) -> None:
        self.by_pid: dict[int, tuple[str, ProcessIdentity]] = {}

    def put(self, pid: int, pod_name: str, container: str) -> None:
        cid = f"cid-{pod_name}-{container}"
        self.by_pid[pid] = (cid, ProcessIdentity(cid, container, pod_name, "team"))

    def identify(self, pid: int) -> ProcessIdentity:
        return self.by_pid.get(pid, ("", ProcessIdentity()))[1]

    def cgroup_of(self, pid: int) -> CgroupIdentity:
        cid = self.by_pid.get(pid, ("", None))[0]
        return CgroupIdentity(Runtime.CONTAINERD, cid) if cid else CgroupIdentity(Runtime.UNKNOWN, reason="host")


def fanotify(paths: Sequence[str]) -> EventSource:
    why_not = probe_fanotify(list(paths))
    if why_not is not None:
        pytest.skip(f"fanotify not usable here: {why_not}")
    return FanotifySource(paths)


def scan(paths: Sequence[str]) -> EventSource:
    return ProcScanSource(paths, interval=0.05)


def start_monitor(tmp_path: Path, containers: Containers, sampler: Sampler,
                  make_source: Callable[[Sequence[str]], EventSource],
                  decider: RiskOpenDecider | None = None) -> tuple[UsageMonitor, list[str]]:
    devices = [stand_in(str(tmp_path), f"nvidia{i}") for i in range(2)]
    monitor = UsageMonitor("n1", {d: i for i, d in enumerate(devices)}, (), sampler,
                           MonitorConfig(str(tmp_path / "state.json")), identify=containers.identify,
                           choose=lambda paths: SourceChoice(make_source(paths), "test"),
                           **({"decide": chain_deciders(decider)} if decider is not None else {}))
    monitor.start()
    return monitor, devices


def wait_for_holder(monitor: UsageMonitor, path: str, pid: int) -> None:
    """Until ``pid`` is a recorded holder of ``path``, named (as the monitor's loop names holders
    whose container became known after their open)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        monitor.recorder.identify_again()
        device = monitor.state.device(path)
        if device is not None and (holder := device.holder(pid)) is not None and holder.container:
            return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} never recorded as a holder of {path}")


def test_refuse_opens_denies_the_risky_containers_next_open_with_fanotify(tmp_path: Path) -> None:
    containers, sampler = Containers(), Sampler()
    decider = RiskOpenDecider(containers.cgroup_of)
    monitor, devices = start_monitor(tmp_path, containers, sampler, fanotify, decider)
    backend = FakeGpuBackend.from_dict(fake_gpu_file(2))
    agent = StandInAgent([pod("train", {"main": (CardSlice(0, 4096, 300),)}), pod("web", None)], backend.inventory())
    events: list[tuple[str, str, str, str]] = []

    async def post(namespace: str, pod_name: str, reason: str, message: str) -> None:
        events.append((namespace, pod_name, reason, message))

    responder = RiskResponder(RiskAction.REFUSE_OPENS, post, decider=decider,
                              can_refuse=lambda: monitor.source is not None and monitor.source.can_decide)
    checks = RiskMonitor(agent, monitor, responder, decider=decider, grace_s=0.0)  # type: ignore[arg-type]
    try:
        # the web pod asked for no GPU; a second process of the same container waits to open another card
        second = OpenOnCue(devices[1])
        containers.put(second.pid, "web", "app")
        with HoldingChild(devices[0]) as rogue:
            containers.put(rogue.pid, "web", "app")
            wait_for_holder(monitor, devices[0], rogue.pid)
            new = asyncio.run(checks.step())
            assert [(r.kind, r.card, r.pod, r.pid) for r in new] == [(RiskKind.UNGRANTED_CARD, 0, "web", rogue.pid)]
            assert second.open() == errno.EPERM  # the kernel refused it: fanotify's permission event
            bystander = OpenOnCue(devices[1])  # a process of no container is not affected
            assert bystander.open() == 0
        assert [e[2] for e in events] == ["GpuRiskUngrantedCard"] and "are refused" in events[0][3]
        registry = CollectorRegistry()
        registry.register(RiskCollector(checks))  # type: ignore[arg-type]
        scraped = generate_latest(registry).decode()
        assert ('gpupool_risk_detected_total{action="refuse-opens",kind="ungranted-card",node="n1"} 1.0'
                in scraped)
        assert 'gpupool_risk_opens_refused_total{node="n1"} 1.0' in scraped
    finally:
        monitor.stop()


def test_over_memory_without_enforcement_is_reported_with_the_proc_scan(tmp_path: Path) -> None:
    containers, sampler = Containers(), Sampler()
    monitor, devices = start_monitor(tmp_path, containers, sampler, scan)
    backend = FakeGpuBackend.from_dict(fake_gpu_file(2))
    agent = StandInAgent([pod("train", {"main": (CardSlice(1, 4096, 300),)})], backend.inventory())
    events: list[tuple[str, str, str, str]] = []

    async def post(namespace: str, pod_name: str, reason: str, message: str) -> None:
        events.append((namespace, pod_name, reason, message))

    responder = RiskResponder(RiskAction.CORDON_CARD, post, cordon=agent.cordon)
    checks = RiskMonitor(agent, monitor, responder, grace_s=0.0)  # type: ignore[arg-type]

    async def rounds() -> list[list[tuple[RiskKind, int]]]:
        seen = []
        with HoldingChild(devices[1]) as trainer:
            containers.put(trainer.pid, "train", "main")
            await asyncio.to_thread(wait_for_holder, monitor, devices[1], trainer.pid)
            sampler.memory = {1: {trainer.pid: 4000}}
            await monitor.step()
            seen.append([(r.kind, r.card) for r in await checks.step()])  # within its grant
            sampler.memory = {1: {trainer.pid: 9000}}
            await monitor.step()
            seen.append([(r.kind, r.card) for r in await checks.step()])
        deadline = time.monotonic() + WAIT_SECONDS
        while monitor.state.device(devices[1]).holders and time.monotonic() < deadline:  # type: ignore[union-attr]
            await asyncio.sleep(0.05)
        sampler.memory = {}
        await monitor.step()
        seen.append([(r.kind, r.card) for r in await checks.step()])
        return seen

    try:
        assert asyncio.run(rounds()) == [[], [(RiskKind.OVER_MEMORY, 1)], []]
    finally:
        monitor.stop()
    assert "use 9000 MiB, above the grant's 4096 MiB" in events[0][3]
    assert [sorted(c) for c in agent.cordons] == [[1], []]  # cordoned, then offered again once it exited


@pytest.mark.slow
def test_a_cordoned_card_is_unhealthy_to_kubelet_until_released_whatever_its_health() -> None:
    async def main() -> None:
        async with running_node(fake_gpu_file(4)) as node:
            kubelet = node.kubelet

            async def allocatable(expected: int) -> None:
                for _ in range(200):
                    if kubelet.allocatable(NAMES.gpu) == expected:
                        return
                    await asyncio.sleep(0.02)
                raise AssertionError(f"allocatable {kubelet.allocatable(NAMES.gpu)}, wanted {expected}")

            await node.agent.cordon({1: "risk"})
            await allocatable(3)
            assert "g1" in kubelet.endpoints[NAMES.gpu].unhealthy
            assert not node.agent.inventory.card(1).healthy
            node.backend.inject(HealthEvent(2, False, "XID 79"))  # a health change keeps the cordon
            await allocatable(2)
            node.backend.inject(HealthEvent(2, True, "recovered"))
            await allocatable(3)
            assert not node.agent.inventory.card(1).healthy
            await node.agent.cordon({})
            await allocatable(4)

    asyncio.run(main())


@pytest.mark.slow
def test_a_restarted_agent_judges_no_restored_holder_before_it_has_listed_its_pods(tmp_path: Path) -> None:
    """Issue 28: the restored holders are past the grace period at once; before the agent's first pod
    list their grants were unknown and the owner's own process was reported as ``ungranted-card``."""
    containers, sampler = Containers(), Sampler()
    backend = FakeGpuBackend.from_dict(fake_gpu_file(2))
    monitor, devices = start_monitor(tmp_path, containers, sampler, scan)
    events: list[tuple[str, str, str, str]] = []

    async def post(namespace: str, pod_name: str, reason: str, message: str) -> None:
        events.append((namespace, pod_name, reason, message))

    try:
        with HoldingChild(devices[0]) as owner, HoldingChild(devices[1]) as rogue:
            containers.put(owner.pid, "train", "main")
            containers.put(rogue.pid, "web", "app")
            wait_for_holder(monitor, devices[0], owner.pid)
            wait_for_holder(monitor, devices[1], rogue.pid)
            monitor.stop()
            # the agent restarts: a new monitor restores both holders from the state file
            restarted, _ = start_monitor(tmp_path, containers, sampler, scan)
            assert {h.pid for h in restarted.state.device(devices[0]).holders} == {owner.pid}  # type: ignore[union-attr]
            agent = StandInAgent([pod("train", {"main": (CardSlice(0, 4096, 300),)}), pod("web", None)],
                                 backend.inventory(), listed=False)
            now = [time.time()]
            checks = RiskMonitor(agent, restarted, RiskResponder(RiskAction.REPORT, post),  # type: ignore[arg-type]
                                 grace_s=0.0, clock=lambda: now[0])
            try:
                assert asyncio.run(checks.step()) == [] and not checks.ready  # nothing listed: nothing judged
                agent.listed = True
                found = asyncio.run(checks.step())
                assert checks.ready
                assert [(r.kind, r.pod, r.pid) for r in found] == [(RiskKind.UNGRANTED_CARD, "web", rogue.pid)]
                assert [e[1] for e in events] == ["web"]  # the owner's process never was a risk
            finally:
                restarted.stop()
    finally:
        monitor.stop()


def test_a_list_that_never_completes_holds_the_risk_checks_for_a_bounded_time(tmp_path: Path) -> None:
    containers, sampler = Containers(), Sampler()
    monitor, devices = start_monitor(tmp_path, containers, sampler, scan)
    agent = StandInAgent([], FakeGpuBackend.from_dict(fake_gpu_file(2)).inventory(), listed=False)

    async def post(namespace: str, pod_name: str, reason: str, message: str) -> None:
        return None

    now = [time.time()]
    checks = RiskMonitor(agent, monitor, RiskResponder(RiskAction.REPORT, post),  # type: ignore[arg-type]
                         grace_s=0.0, clock=lambda: now[0])
    try:
        with HoldingChild(devices[0]) as rogue:
            containers.put(rogue.pid, "web", "app")
            wait_for_holder(monitor, devices[0], rogue.pid)
            assert asyncio.run(checks.step()) == []
            now[0] += LIST_WAIT_S
            assert [(r.kind, r.pod) for r in asyncio.run(checks.step())] == [(RiskKind.UNGRANTED_CARD, "web")]
    finally:
        monitor.stop()


@pytest.mark.slow
def test_a_pod_missing_from_one_list_keeps_its_grant_for_a_while(tmp_path: Path) -> None:
    """Issue 28: a pod being deleted leaves kubelet's PodResources List at once while its processes
    still hold the card for a moment; the owner's were reported ``ungranted-card`` then (seen in
    tests/e2e/test_reclaim_agent_killed_e2e.py). A grant seen in a list counts GRANT_MEMORY_S longer;
    a container never granted the card is reported at once, as before."""
    containers, sampler = Containers(), Sampler()
    monitor, devices = start_monitor(tmp_path, containers, sampler, scan)
    owner_pod, rogue_pod = pod("train", {"main": (CardSlice(0, 4096, 300),)}), pod("web", None)
    agent = StandInAgent([owner_pod, rogue_pod], FakeGpuBackend.from_dict(fake_gpu_file(2)).inventory())

    async def post(namespace: str, pod_name: str, reason: str, message: str) -> None:
        return None

    now = [0.0]
    checks = RiskMonitor(agent, monitor, RiskResponder(RiskAction.REPORT, post),  # type: ignore[arg-type]
                         grace_s=0.0, clock=lambda: now[0])
    try:
        with HoldingChild(devices[0]) as owner, HoldingChild(devices[1]) as rogue:
            containers.put(owner.pid, "train", "main")
            containers.put(rogue.pid, "web", "app")
            wait_for_holder(monitor, devices[0], owner.pid)
            wait_for_holder(monitor, devices[1], rogue.pid)
            now[0] = time.time() + 1
            assert [(r.kind, r.pod) for r in asyncio.run(checks.step())] == [(RiskKind.UNGRANTED_CARD, "web")]
            agent.pods = []  # both pods deleted: gone from kubelet's list, their processes not yet
            now[0] += GRANT_MEMORY_S - 1
            assert all(r.pod != "train" for r in asyncio.run(checks.step()))
            assert "train" not in {r.pod for r in checks.responder.active.values()}
            now[0] += 2  # still missing past the memory: judged on what is listed
            assert [(r.kind, r.pod) for r in asyncio.run(checks.step())] == [(RiskKind.UNGRANTED_CARD, "train")]
    finally:
        monitor.stop()


def test_the_risk_checks_read_the_dra_drivers_claims(tmp_path: Path) -> None:
    """The agent hands the DRA driver's prepared claims on (``claims_granted``); the checks grant them
    to the containers that use them, so a DRA pod's process on its claim's card is no risk."""
    from tests.nodeagent.risk.test_detector import claim_view, dra_pod

    containers, sampler = Containers(), Sampler()
    monitor, devices = start_monitor(tmp_path, containers, sampler, scan)
    backend = FakeGpuBackend.from_dict(fake_gpu_file(2))
    agent = StandInAgent([dra_pod("infer", {"main": ("infer-gpu",)})], backend.inventory())

    async def post(namespace: str, pod_name: str, reason: str, message: str) -> None:
        raise AssertionError(f"no risk expected: {reason} {message}")

    checks = RiskMonitor(agent, monitor, RiskResponder(RiskAction.REPORT, post), grace_s=0.0)  # type: ignore[arg-type]
    try:
        with HoldingChild(devices[0]) as process:
            containers.put(process.pid, "infer", "main")
            wait_for_holder(monitor, devices[0], process.pid)
            agent.claims_granted = None  # without the driver's claims the same process is a risk
            assert [(r.kind, r.pod) for r in detect(checks.view(), grace_s=0.0)] == [
                (RiskKind.UNGRANTED_CARD, "infer")]
            agent.claims_granted = lambda: [claim_view("infer-gpu", CardSlice(0, 4096, 300))]
            assert checks.view().grants[("team", "infer", "main")] == {0: CardSlice(0, 4096, 300)}
            assert detect(checks.view(), grace_s=0.0) == []
    finally:
        monitor.stop()
