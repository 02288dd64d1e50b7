"""A reclaimed borrower's containers do not start again (issue 26): its task's checkpoint never goes back.

What happened in a CI run of ``tests/e2e/test_checkpoint_moves_e2e.py``: the reclaimed worker wrote
``ckpt-8`` and exited; kubelet restarted the exited container before the eviction reached it; the
restart ran with the first Allocate's environment (no ``GPUPOOL_RESUME_FROM``), counted from 0, and
the eviction's SIGTERM had it write ``ckpt-1``, newer than ``ckpt-8``, which the task's next pod
then resumed from. The node agent now refuses the start of every container of a pod whose reclaim
was decided (the device plugin's PreStartContainer, asked before each start, restarts included)
until the pod leaves the node, an agent restarted meanwhile too (the reclaim journal keeps the
finished reclaim's pod until then).

Here kubelet is a stand-in that does what it did there: when the eviction is posted it restarts the
exited container (asking the agent's ``pre_start`` first, as kubelet does), then, the eviction
landing, sends SIGTERM to whatever of the pod still runs. The workers are scripted: on the
checkpoint signal or SIGTERM one writes ``ckpt-<its step>`` into the task's directory and exits.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpupool.nodeagent.agent import NodeAgent, holder_of
from gpupool.nodeagent.allocated_codec import encode_served
from gpupool.nodeagent.deviceplugin.server import _Servicer
from gpupool.nodeagent.lending.checkpoint_files import newest_checkpoint
from gpupool.nodeagent.lending.setup import LoanedCapacity
from gpupool.nodeagent.monitor.events import Verdict
from gpupool.nodeagent.monitor.usage_state import DeviceState
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.types import PodResourcesSnapshot, StartRefused
from gpupool.testing.memory_pod_source import InMemoryPodSource
from tests.nodeagent.lending.support import NAMES, decoded, holder, inventory
from tests.nodeagent.lending.world import CARD0, PODS, Api, Processes, World, idle_owner, open_, run, settle

BORROWER = ("ns", "borrower")
LENT_IDS = frozenset({"lend-g0-m0", "lend-g0-m1"})
"""The borrower's devices of the lent memory, as kubelet lists them (PodResources) and hands them to
PreStartContainer."""


class Workers(Processes):
    """Scripted workers of the checkpoint protocol in ``directory``: on SIGUSR1 or SIGTERM a worker
    writes ``ckpt-<its step>`` (each write newer than the last) and exits."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self.steps: dict[int, int] = {}
        self._mtime_ns = 1_000_000_000_000_000_000

    def send(self, pid: int, sig: Any) -> None:
        if sig in (signal.SIGUSR1, signal.SIGTERM) and pid in self.alive:
            path = self.directory / f"ckpt-{self.steps[pid]}"
            path.write_text(f"{self.steps[pid]}\n")
            self._mtime_ns += 1_000_000_000
            os.utime(path, ns=(self._mtime_ns, self._mtime_ns))
        super().send(pid, sig)


class Kubelet(Api):
    """The API's eviction as kubelet lives it: until the eviction reaches it, kubelet restarts the
    exited container (after the agent's PreStartContainer); then it terminates what still runs."""

    def __init__(self, workers: Workers, agent: NodeAgent) -> None:
        super().__init__()
        self.workers = workers
        self.agent = agent
        self.restart_when_evicted = True
        self.refusals: list[str] = []

    async def restart_exited(self) -> None:
        """The container exited (its checkpoint written): kubelet starts it again, with the
        environment of the first Allocate, so the worker counts from the start."""
        try:
            await self.agent.pre_start(NAMES.gpu_mem, sorted(LENT_IDS))
        except StartRefused as exc:
            self.refusals.append(str(exc))
            return
        self.workers.alive[250] = "id-borrower-restarted"
        self.workers.steps[250] = 1

    def terminate(self) -> None:
        """The eviction reached kubelet: SIGTERM to every running container of the pod."""
        for pid in [p for p, c in self.workers.alive.items() if c.startswith("id-borrower")]:
            self.workers.send(pid, signal.SIGTERM)

    async def evict(self, namespace: str, name: str) -> str:
        if self.restart_when_evicted:
            await self.restart_exited()
        return await super().evict(namespace, name)


class Listed:
    """kubelet's PodResources: the owner on card 0, the borrower on the lent memory."""

    async def list(self) -> PodResourcesSnapshot:
        return {("ns", "owner"): {"c": {NAMES.gpu_mem: frozenset({"g0-m0"})}},
                BORROWER: {"c": {NAMES.gpu_mem: LENT_IDS}}}


def node(world: World, workers: Workers) -> tuple[Kubelet, Any]:
    """The world with ``workers`` as its processes, and a node agent whose lending part is the world's
    service (what ``node-agent --lending`` assembles); the service is made in the test's body."""
    world.processes = workers
    pods = InMemoryPodSource(NAMES)
    for pod in PODS:
        pods.put(pod)
    backend = FakeGpuBackend.from_dict({"model": "T4", "cards": [{"memoryMiB": 16384}, {"memoryMiB": 16384}]})
    agent = NodeAgent("n1", NAMES, backend, pods, Listed(), encode_served)
    kubelet = Kubelet(workers, agent)
    world.api = kubelet

    def lend() -> Any:
        service = world.started()
        agent.lent = LoanedCapacity("n1", service, world.pods, inventory, agent.listed_pods)
        return service

    return kubelet, lend


@pytest.mark.parametrize("restart", ["while-the-reclaim-evicts", "after-the-reclaim-before-the-eviction-lands",
                                     "after-the-agent-restarted-before-the-eviction-lands"])
def test_a_reclaimed_borrowers_restarted_container_never_sets_its_tasks_checkpoint_back(
        tmp_path: Path, restart: str) -> None:
    task = tmp_path / "task"
    task.mkdir()
    workers = Workers(task)
    world = World(tmp_path, PODS)
    kubelet, lend = node(world, workers)
    kubelet.restart_when_evicted = restart == "while-the-reclaim-evicts"

    async def body() -> None:
        service = lend()
        idle_owner(world)
        await service.step()
        assert service.decide(open_(200)) is Verdict.ALLOW  # the borrower works on the loan: step 8
        workers.alive, workers.steps = {200: "id-borrower"}, {200: 8}
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
        assert service.decide(open_(101)) is Verdict.ALLOW  # the owner is back: the borrower is reclaimed
        await settle(service)
        assert workers.sent[0] == (200, "SIGUSR1") and kubelet.evicted == [BORROWER]
        if "agent-restarted" in restart:  # a new agent on the same files: what it refuses was on disk
            lend()
        if not kubelet.restart_when_evicted:
            await kubelet.restart_exited()
        kubelet.terminate()

    run(body)
    assert newest_checkpoint(str(task)) == "ckpt-8", sorted(p.name for p in task.iterdir())
    assert 250 not in workers.steps  # never started again, so never signalled either
    [refusal, *_] = kubelet.refusals
    assert "ns/borrower" in refusal and "GpuReclaimed" in refusal and "starts again" in refusal


def test_only_the_reclaimed_pod_is_refused_a_start_and_only_while_it_is_on_the_node(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        assert service.start_refusal(BORROWER, "uid-borrower") is None  # borrowing: it runs
        world.processes.alive = {200: "id-borrower"}
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
        assert service.decide(open_(101)) is Verdict.ALLOW
        in_flight = service.start_refusal(BORROWER, "uid-borrower")
        assert in_flight is not None and "is being reclaimed" in in_flight
        assert service.start_refusal(BORROWER, "") is not None  # the UID unknown: the name decides
        await settle(service)
        finished = service.start_refusal(BORROWER, "uid-borrower")
        assert finished is not None and "was reclaimed" in finished
        assert service.start_refusal(("ns", "owner"), "uid-owner") is None
        assert service.start_refusal(BORROWER, "uid-of-a-new-pod-of-that-name") is None
        world.pods.on_list(decoded(*[p for p in PODS if p["metadata"]["name"] != "borrower"]))
        await service.step()  # the evicted pod left the node
        world.pods.on_list(decoded(*PODS))
        assert service.start_refusal(BORROWER, "uid-borrower") is None

    run(body)


def test_the_pod_holding_the_devices_is_found_by_any_of_its_ids() -> None:
    snapshot: PodResourcesSnapshot = {("ns", "a"): {"c": {"r": frozenset({"1", "2"})}}, ("ns", "b"): {"c": {}}}
    assert holder_of(snapshot, "r", frozenset({"2"})) == ("ns", "a")
    assert holder_of(snapshot, "r", frozenset({"3"})) is None
    assert holder_of(snapshot, "other", frozenset({"1"})) is None


class Refusing:
    async def pre_start(self, resource: str, device_ids: list[str]) -> None:
        raise StartRefused("gpupool: pod ns/borrower: its GPU was reclaimed")


class Aborted(Exception):
    pass


class Context:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


def test_a_refused_start_is_a_failed_precondition_with_the_reason_for_kubelet() -> None:
    class Request:
        devices_ids = ("lend-g0-m0",)

    servicer = _Servicer(NAMES.gpu_mem, Refusing())  # type: ignore[arg-type]
    with pytest.raises(Aborted) as caught:
        asyncio.run(servicer.PreStartContainer(Request(), Context()))
    assert caught.value.args == (grpc.StatusCode.FAILED_PRECONDITION, "gpupool: pod ns/borrower: its GPU was reclaimed")
