"""One ledger, two places (issue 24): the extender's booking of DRA claims and the node agent's
check at NodePrepareResources give the same verdict, and so do the extender's filter and the
node's check before Allocate with claims prepared.

The extender books every claim of gpupool's driver beside the extended-resource pods
(:mod:`gpupool.extender.dra_bookings`: the claim read by ``claim_shares``, its device's NVML index
turned into the ledger position) and a pod fits where :meth:`ClusterState.check` says so. The node
agent checks a claim before preparing it on its own one-node ledger holding the device plugin's
pods and the claims prepared already (:meth:`ClaimState.check_fits`), and a pod's container before
Allocate beside the prepared claims (:func:`check_assignment` with ``ClaimState.as_pods``). Both
are fed the same random cards (NVML indices with gaps), extended-resource pods, prepared claims and
a new claim or pod; both must refuse the same things: the core's card rule decides in both.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpupool.api.annotations import Assignment, encode_assignment
from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, NodeSpec, Placement, Topology
from gpupool.core.state import ClusterState
from gpupool.kube.claim_holding import claim_placement, read_claim
from gpupool.kube.dra_claims import ClaimError
from gpupool.nodeagent.assignment_codec import node_assignment
from gpupool.nodeagent.dra.cdi import CdiSpecs
from gpupool.nodeagent.dra.checkpoint import PreparedClaim
from gpupool.nodeagent.dra.claim_allocation import ClaimRef, read_allocation
from gpupool.nodeagent.dra.claim_state import ClaimState
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.schedule_check import AssignmentRefused, check_assignment
from gpupool.nodeagent.types import PodView

NODE = "node-a"
DRIVER = "gpu.gpupool.io"
STAMP = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


class World(NamedTuple):
    """One node as both sides see it: pods in ledger positions, claims as the API serves them."""

    cards: tuple[GpuCard, ...]
    pods: tuple[Placement, ...]
    claims: tuple[dict[str, Any], ...]
    new_claim: dict[str, Any]
    new_pod: Placement


def claim(name: str, shares: list[tuple[int, int | None, int]]) -> dict[str, Any]:
    """A claim allocated on ``NODE``: per share (NVML index, memory MiB or None for the whole card,
    compute percent)."""
    results = []
    for i, (index, memory, compute) in enumerate(shares):
        result: dict[str, Any] = {"request": f"r{i}", "driver": DRIVER, "pool": NODE, "device": f"gpu-{index}"}
        if memory is not None:
            result["consumedCapacity"] = {"memory": f"{memory}Mi", "compute": str(compute)}
        results.append(result)
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
            "status": {"allocation": {"devices": {"results": results}}}}


@st.composite
def cards(draw: st.DrawFn) -> tuple[GpuCard, ...]:
    indices = sorted(draw(st.sets(st.integers(0, 7), min_size=1, max_size=3)))
    return tuple(GpuCard(i, f"GPU-{i}", "A100", draw(st.sampled_from([2048, 8192, 16384])),
                         healthy=draw(st.sampled_from([True, True, True, False]))) for i in indices)


@st.composite
def claims(draw: st.DrawFn, node_cards: tuple[GpuCard, ...], name: str) -> dict[str, Any]:
    shares: list[tuple[int, int | None, int]] = []
    for _ in range(draw(st.integers(1, 2))):
        card = draw(st.sampled_from(node_cards))
        if draw(st.integers(0, 5)) == 0:
            shares.append((card.index, None, 0))
        else:
            shares.append((card.index, draw(st.integers(1, card.memory_mib // 256)) * 256, draw(st.integers(0, 60))))
    return claim(name, shares)


@st.composite
def pods(draw: st.DrawFn, node_cards: tuple[GpuCard, ...], key: str) -> Placement:
    containers = []
    for c in range(draw(st.integers(1, 2))):
        pos = draw(st.integers(0, len(node_cards) - 1))
        card = node_cards[pos]
        if draw(st.integers(0, 5)) == 0:
            piece = CardSlice(pos, card.memory_mib, card.compute, exclusive=True)
        else:
            piece = CardSlice(pos, draw(st.integers(1, card.memory_mib // 256)) * 256, draw(st.integers(0, 12)) * 50)
        containers.append(ContainerAssignment(f"c{c}", (piece,)))
    return Placement(key, NODE, 0, 0, tuple(containers))


@st.composite
def worlds(draw: st.DrawFn) -> World:
    node_cards = draw(cards())
    placed = tuple(draw(pods(node_cards, f"default/p{i}")) for i in range(draw(st.integers(0, 3))))
    prepared = tuple(draw(claims(node_cards, f"c{i}")) for i in range(draw(st.integers(0, 3))))
    return World(node_cards, placed, prepared, draw(claims(node_cards, "new")), draw(pods(node_cards, "default/new")))


def spec(world: World) -> NodeSpec:
    return NodeSpec(NODE, cpu_milli=0, memory_mib=0, cards=world.cards)


def extender_ledger(world: World) -> ClusterState:
    """The extender's row of the node: the pods' and the claims' bookings (both as the cluster holds them)."""
    state = ClusterState([spec(world)])
    for placed in world.pods:
        state.claim(placed)
    for obj in world.claims:
        record = read_claim(obj, DRIVER)
        assert record is not None and record.problem is None
        state.claim(claim_placement(record, spec(world)))
    return state


def extender_claim_verdict(world: World) -> str | None:
    record = read_claim(world.new_claim, DRIVER)
    assert record is not None
    placement = claim_placement(record, spec(world))
    state = extender_ledger(world)
    for pos in placement.held_per_card():  # the allocator publishes no unhealthy card: none fits there
        if not world.cards[pos].healthy:
            return f"card {pos} unhealthy"
    return state.check(placement)


def pod_view(world: World, placed: Placement) -> PodView:
    namespace, name = placed.pod_key.split("/")
    text = encode_assignment(Assignment.from_placement(placed, spec(world), STAMP, pod_uid=f"uid-{name}"))
    return PodView(namespace, name, f"uid-{name}", NODE, 0.0, False, (),
                   assignment=node_assignment(text, placed.pod_key))


def node_state(world: World, directory: str) -> ClaimState:
    """The node's DRA state with ``world.claims`` prepared and the pods listed by kubelet."""
    inventory = GpuInventory(world.cards, Topology.flat(len(world.cards)),
                             tuple(f"/dev/nvidia{c.index}" for c in world.cards))
    views = [pod_view(world, p) for p in world.pods]
    state = ClaimState(NODE, DRIVER, lambda: inventory, _no_reads, CdiSpecs(directory, "gpupool.io"),
                       f"{directory}/checkpoint.json", held_elsewhere=lambda: views)
    for obj in world.claims:
        meta = obj["metadata"]
        ref = ClaimRef(meta["namespace"], meta["name"], meta["uid"])
        allocation = read_allocation(ref, obj, DRIVER, NODE)
        state._claims[ref.uid] = PreparedClaim(ref, ("", ""), "", allocation.shares, f"id-{ref.uid}")
    return state


async def _no_reads(namespace: str, name: str) -> None:
    raise AssertionError("no claim is read in these checks")


def node_claim_verdict(world: World, directory: str) -> str | None:
    obj = world.new_claim
    meta = obj["metadata"]
    ref = ClaimRef(meta["namespace"], meta["name"], meta["uid"])
    try:
        node_state(world, directory).check_fits(read_allocation(ref, obj, DRIVER, NODE))
    except ClaimError as exc:
        return str(exc)
    return None


def node_pod_verdict(world: World, directory: str) -> str | None:
    """The node's check of every container of the new pod beside the listed pods and prepared claims."""
    state = node_state(world, directory)
    inventory = GpuInventory(world.cards, Topology.flat(len(world.cards)),
                             tuple(f"/dev/nvidia{c.index}" for c in world.cards))
    pod = pod_view(world, world.new_pod)
    granted = [*(pod_view(world, p) for p in world.pods), *state.as_pods()]
    assert pod.assignment is not None
    try:
        for one in pod.assignment.placement.containers:
            check_assignment(NODE, inventory, pod, one, granted)
    except AssignmentRefused as exc:
        return str(exc)
    return None


_CARDS = (GpuCard(2, "GPU-2", "A100", 16384), GpuCard(5, "GPU-5", "A100", 16384))
_POD_12G_ON_5 = Placement("default/p0", NODE, 0, 0, (ContainerAssignment("c0", (CardSlice(1, 12288, 0),)),))
_CLAIM_12G_ON_5 = claim("c0", [(5, 12288, 0)])
MIXED = World(_CARDS, (_POD_12G_ON_5,), (), claim("new", [(5, 8192, 0)]), dataclasses.replace(
    _POD_12G_ON_5, pod_key="default/new"))


def test_a_claim_on_memory_an_extended_resource_pod_holds_is_refused_by_both(tmp_path: Any) -> None:
    assert extender_claim_verdict(MIXED) is not None
    reason = node_claim_verdict(MIXED, str(tmp_path))
    assert reason == ("claim ns/new (uid-new): device gpu-5 (GPU-5) would be over-committed: 8192 MiB and 0% asked, "
                      "12288 MiB and 0% of its 16384 MiB, 100% held by default/p0")


def test_a_pod_on_memory_a_claim_holds_is_refused_by_both(tmp_path: Any) -> None:
    world = MIXED._replace(pods=(), claims=(_CLAIM_12G_ON_5,))
    assert extender_ledger(world).check(world.new_pod) is not None
    reason = node_pod_verdict(world, str(tmp_path))
    assert reason is not None and "12288 MiB of 16384 MiB already granted to ns/claim c0" in reason


@pytest.mark.slow
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(worlds())
@example(MIXED)
def test_the_node_and_the_extender_agree_on_a_new_claim(tmp_path: Any, world: World) -> None:
    core, node = extender_claim_verdict(world), node_claim_verdict(world, str(tmp_path))
    assert (core is None) == (node is None), f"extender: {core!r}; node: {node!r}"


@pytest.mark.slow
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(worlds())
@example(MIXED._replace(pods=(), claims=(_CLAIM_12G_ON_5,)))
def test_the_node_and_the_extender_agree_on_a_new_pod_beside_claims(tmp_path: Any, world: World) -> None:
    state = extender_ledger(world)
    core = state.check(world.new_pod)
    node = node_pod_verdict(world, str(tmp_path))
    assert (core is None) == (node is None), f"extender: {core!r}; node: {node!r}"
