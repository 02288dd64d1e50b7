"""Schedule verification on the node: Allocate refuses an assignment its cards cannot honour now."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from typing import Any

import pytest

from gpupool.api.annotations import Assignment, encode_assignment
from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, NodeSpec, Placement, Topology
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.allocated_codec import encode_served
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.pod_view import pod_view_from_json
from gpupool.nodeagent.schedule_check import AssignmentRefused, check_assignment
from gpupool.nodeagent.types import PodView
from gpupool.testing.fake_node import agent_on_fake_kubelet
from gpupool.testing.memory_pod_source import InMemoryPodSource
from tests.nodeagent.harness import NAMES, fake_pod

CARD = 16384
CARDS = (GpuCard(0, "GPU-0", "T4", CARD), GpuCard(1, "GPU-1", "T4", CARD, healthy=False))
INVENTORY = GpuInventory(CARDS, Topology.flat(2), ("/dev/nvidia0", "/dev/nvidia1"))
#: What the scheduler saw: the node's cards then, eight of them (six have gone since).
SCHEDULED = NodeSpec("node-a", cpu_milli=1000, memory_mib=1024,
                     cards=(*CARDS, *(GpuCard(i, f"GPU-{i}", "T4", CARD) for i in range(2, 8))))
Slices = dict[str, tuple[CardSlice, ...]]


def pod_json(name: str, app: Slices, init: Slices | None = None, *, phase: str = "Pending",
             allocated: bool = False) -> dict[str, Any]:
    """A pod bound to node-a whose containers ask exactly their slices in 256 MiB units."""
    init = init or {}
    containers = tuple(ContainerAssignment(c, s, init=True) for c, s in init.items())
    containers += tuple(ContainerAssignment(c, s) for c, s in app.items())
    placement = Placement(f"default/{name}", "node-a", 0, 0, containers)
    stamp = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
    notes = {NAMES.assignment: encode_assignment(Assignment.from_placement(placement, SCHEDULED, stamp))}
    if allocated:
        notes[NAMES.allocated] = encode_served("node-a", dt.datetime(2024, 5, 1, tzinfo=dt.UTC), [])

    def limits(slices: tuple[CardSlice, ...]) -> dict[str, str]:
        return {NAMES.gpu_mem: str(slices[0].memory_mib // 256)}

    return {"metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}",
                         "creationTimestamp": "2024-05-01T10:00:00Z", "annotations": notes},
            "spec": {"nodeName": "node-a",
                     "initContainers": [{"name": c, "resources": {"limits": limits(s)}} for c, s in init.items()],
                     "containers": [{"name": c, "resources": {"limits": limits(s)}} for c, s in app.items()]},
            "status": {"phase": phase}}


def view(doc: dict[str, Any]) -> PodView:
    return pod_view_from_json(doc, NAMES)


def mib(n: int, card: int = 0, compute: int = 0, exclusive: bool = False) -> tuple[CardSlice, ...]:
    return (CardSlice(card, n, compute, exclusive),)


def check(pod: dict[str, Any], container: str, *granted: dict[str, Any]) -> None:
    target = view(pod)
    assert target.assignment is not None
    assignment = target.assignment.container(container)
    assert assignment is not None
    check_assignment("node-a", INVENTORY, target, assignment, [view(g) for g in granted])


@pytest.mark.parametrize(("pod", "granted", "message"), [
    pytest.param(pod_json("p", {"main": mib(4096, card=1)}), [], "card 1 (GPU-1) on node node-a is unhealthy",
                 id="unhealthy-card"),
    pytest.param(pod_json("p", {"main": mib(4096, card=7)}), [], "card 7 is not on node node-a (it has [0, 1])",
                 id="missing-card"),
    pytest.param(pod_json("p", {"main": mib(8192)}), [pod_json("a", {"main": mib(12288)})],
                 "8192 MiB asked, 12288 MiB of 16384 MiB already granted to default/a", id="memory-over-committed"),
    pytest.param(pod_json("p", {"main": mib(256, compute=600)}),
                 [pod_json("a", {"main": mib(256, compute=500)})],
                 "60 % compute asked, 50 % already granted to default/a", id="compute-over-committed"),
    pytest.param(pod_json("p", {"main": mib(CARD, compute=1000, exclusive=True)}),
                 [pod_json("a", {"main": mib(256)})], "exclusive to one pod but already granted to default/a",
                 id="exclusive-wanted-card-shared"),
    pytest.param(pod_json("p", {"main": mib(256)}), [pod_json("a", {"main": mib(CARD, compute=1000, exclusive=True)})],
                 "exclusive to one pod but already granted to default/a", id="card-held-exclusively"),
])
def test_refusals_name_the_card_and_why(pod: dict[str, Any], granted: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(AssignmentRefused, match=re.escape(message)):
        check(pod, "main", *granted)


@pytest.mark.parametrize(("pod", "granted"), [
    pytest.param(pod_json("p", {"main": mib(8192)}), [pod_json("a", {"main": mib(8192)})], id="exactly-full"),
    pytest.param(pod_json("p", {"main": mib(8192)}), [pod_json("a", {"main": mib(12288)}, phase="Succeeded")],
                 id="finished-pods-hold-nothing"),
    pytest.param(pod_json("p", {"main": mib(8192)}, init={"warm": mib(CARD)}), [],
                 id="own-init-container-runs-before-the-app"),
    pytest.param(pod_json("p", {"main": mib(8192)}), [pod_json("p", {"main": mib(16384)})],
                 id="the-pod-itself-is-not-another-holder"),
])
def test_assignments_that_fit_are_granted(pod: dict[str, Any], granted: list[dict[str, Any]]) -> None:
    check(pod, "main", *granted)


class FirstBorrows:
    """Lent capacity where the pod "first" borrows (it vouches for no one: the owners' check runs)."""

    def extra_devices(self, resource: str) -> list[tuple[str, bool]]:
        return []

    def vouch(self, pod: PodView, container: ContainerAssignment) -> bool:
        return False

    def on_loan(self, pod: PodView) -> bool:
        return pod.name == "first"

    def start_refusal(self, pod: PodView) -> str | None:
        return None


@pytest.mark.slow
@pytest.mark.parametrize("first_borrows", [pytest.param(False, id="two-owners-over-commit"),
                                           pytest.param(True, id="a-borrower-leaves-the-owners-room")])
def test_an_extender_over_commitment_is_refused_at_allocate_and_reported_on_the_pod(first_borrows: bool) -> None:
    """Two pods assigned 12 GiB each on card 0 of two 16 GiB cards (an extender with a stale view):
    kubelet's device counts admit both (the node has 32 GiB of devices); the agent grants the first,
    refuses the second's Allocate (kubelet fails the pod) and the pod gets the reason. When the first
    is a borrower (it holds lent capacity, booked against the loan), it never refuses an owner."""
    first = pod_json("first", {"main": mib(12288)})
    second = pod_json("second", {"main": mib(12288)})
    earlier = pod_json("earlier", {"main": mib(2048)}, phase="Running", allocated=True)  # before an agent restart
    backend = FakeGpuBackend.from_dict({"model": "T4", "cards": [{"uuid": "GPU-0", "memoryMiB": CARD},
                                                                 {"uuid": "GPU-1", "memoryMiB": CARD}]})
    source = InMemoryPodSource(NAMES)
    for doc in (first, second, earlier):
        source.put(doc)
    reports: list[tuple[tuple[str, str], str]] = []

    async def report(pod: tuple[str, str], reason: str) -> None:
        reports.append((pod, reason))

    def make_agent(reader: PodResourcesClient) -> NodeAgent:
        return NodeAgent("node-a", NAMES, backend, source, reader, encode_served, poll_s=0.2, report_refusal=report,
                         lent=FirstBorrows() if first_borrows else None)

    async def main() -> None:
        async with agent_on_fake_kubelet(make_agent) as node:
            kubelet = node.kubelet
            await kubelet.handle_pod_additions([fake_pod(earlier)])
            await kubelet.handle_pod_additions([fake_pod(first)])
            await kubelet.handle_pod_additions([fake_pod(second)])
            await kubelet.wait_idle(30)
            await asyncio.sleep(0.05)
            phases = {p.name: (p.phase, p.reason) for p in kubelet.pod_manager.values()}
            assert phases["earlier"][0] == phases["first"][0] == "Running"
            if first_borrows:
                assert phases["second"][0] == "Running" and node.agent.stats.refused == 0
                return
            assert phases["second"][0] == "Failed"
            assert phases["second"][1].startswith("UnexpectedAdmissionError")
            assert node.agent.stats.refused == 1

    asyncio.run(main())
    if first_borrows:
        assert reports == []
        return
    [(pod, reason)] = reports
    assert pod == ("default", "second")
    assert "12288 MiB asked, 14336 MiB of 16384 MiB already granted to default/earlier, default/first" in reason
