"""The node's check before Allocate and the extender's decision agree by construction (issue 22).

The extender books a pod on its node's row of the core's ledger (:meth:`ClusterState.check`, the
card rule; the lent rule for a placement with ``borrowed_from``). The node agent checks the same
pod before Allocate with :func:`check_assignment` (owners) and :func:`check_borrower` (borrowers)
on its own one-node ledger. Both are fed the same random cards (NVML indices with gaps, so a ledger
position is not the index), granted owners, loans and granted borrowers, and the same new pod; the
assignment goes through the real ``assignment-v1`` codec (positions → index + uuid on the
extender's side, index on the node's) and the loans through ``lendable``'s card entries. The
verdicts must be the same.

The node's earlier check disagreed where it was weaker (it accepted, the core refuses): a borrower
was checked per slice against the loan's memory only, so a second borrower that over-fills the
loan's memory, any borrower over the loan's compute, a borrower asking a whole lent card, and a
borrower on an unhealthy lent card were granted (pinned below as examples), and a borrower on a card
not lent (any more) was checked against its owners' room instead of being refused. One case went the
other way (the node refused, the core accepts): a pod whose own assignment holds one card whole in
one app container and again in another; the core folds the pod's share of the card into "whole"
(:meth:`Placement.held_per_card`) and asks only that the card be idle, the earlier node check added
the memory up. The extender never writes such an assignment; the node now follows the core.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpupool.api.annotations import Assignment, encode_assignment
from gpupool.api.lending import LendableCard
from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, NodeSpec, Placement, Topology
from gpupool.core.state import ClusterState
from gpupool.extender.lendable import card_loans
from gpupool.nodeagent.assignment_codec import node_assignment
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.schedule_check import AssignmentRefused, check_assignment, check_borrower
from gpupool.nodeagent.types import PodView

NODE = "node-a"
OWNER = "default/owner"
STAMP = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


class World(NamedTuple):
    """One node as both sides see it; placements in ledger positions (the extender's words)."""

    cards: tuple[GpuCard, ...]
    owners: tuple[Placement, ...]
    loans: tuple[LendableCard, ...]
    borrowers: tuple[Placement, ...]
    pod: Placement
    borrows: bool
    listed: tuple[GpuCard, ...] = ()
    """The cards in the order the node's inventory lists them (NVML's order need not be the index's)."""


@st.composite
def cards(draw: st.DrawFn) -> tuple[GpuCard, ...]:
    indices = sorted(draw(st.sets(st.integers(0, 7), min_size=1, max_size=4)))
    return tuple(GpuCard(i, f"GPU-{i}", "T4", draw(st.sampled_from([1024, 4096, 16384])),
                         compute=draw(st.sampled_from([1000, 1000, 700])),
                         healthy=draw(st.sampled_from([True, True, True, False])))
                 for i in indices)


@st.composite
def container(draw: st.DrawFn, node_cards: tuple[GpuCard, ...], name: str, whole: bool) -> ContainerAssignment:
    positions = draw(st.lists(st.integers(0, len(node_cards) - 1), min_size=1, max_size=2, unique=True))
    slices = []
    for pos in positions:
        card = node_cards[pos]
        if whole and draw(st.booleans()):
            slices.append(CardSlice(pos, card.memory_mib, card.compute, exclusive=True))
            continue
        memory = draw(st.integers(0, card.memory_mib // 256)) * 256
        compute = draw(st.integers(0, 20)) * 50
        slices.append(CardSlice(pos, memory or (256 if not compute else 0), compute))
    return ContainerAssignment(name, tuple(slices), init=draw(st.booleans()) and name != "c0")


@st.composite
def placement(draw: st.DrawFn, node_cards: tuple[GpuCard, ...], key: str, whole: bool = True) -> Placement:
    count = draw(st.integers(1, 2))
    containers = tuple(draw(container(node_cards, f"c{i}", whole)) for i in range(count))
    return Placement(key, NODE, 0, 0, containers)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    node_cards = draw(cards())
    owners = tuple(draw(placement(node_cards, f"default/o{i}")) for i in range(draw(st.integers(0, 3))))
    lent = draw(st.sets(st.integers(0, len(node_cards) - 1)))
    loans = tuple(LendableCard(node_cards[pos].index, node_cards[pos].uuid, OWNER, "main",
                               draw(st.integers(0, node_cards[pos].memory_mib // 256)) * 256,
                               draw(st.integers(0, 100)), 0.0) for pos in sorted(lent))
    borrowers = tuple(draw(placement(node_cards, f"default/b{i}", whole=False))
                      for i in range(draw(st.integers(0, 3))))
    borrows = draw(st.booleans())
    return World(node_cards, owners, loans, borrowers, draw(placement(node_cards, "default/new")), borrows,
                 tuple(draw(st.permutations(node_cards))))


def spec(world: World) -> NodeSpec:
    return NodeSpec(NODE, cpu_milli=0, memory_mib=0, cards=world.cards)


def extender_verdict(world: World) -> str | None:
    """The extender's rule: its ledger row for the node, every grant booked, the new pod checked."""
    state = ClusterState([spec(world)])
    loans, _ = card_loans(world.loans, spec(world))
    state.set_loans(NODE, loans)
    for owner in world.owners:
        state.claim(owner)
    for borrower in world.borrowers:
        state.claim(dataclasses.replace(borrower, borrowed_from=OWNER))
    pod = dataclasses.replace(world.pod, borrowed_from=OWNER) if world.borrows else world.pod
    return state.check(pod)


def node_view(world: World, placed: Placement) -> PodView:
    """The pod as the node agent reads it: ``assignment-v1`` written by the extender, decoded."""
    namespace, name = placed.pod_key.split("/")
    text = encode_assignment(Assignment.from_placement(placed, spec(world), STAMP, pod_uid=f"uid-{name}"))
    return PodView(namespace, name, f"uid-{name}", NODE, 0.0, False, (),
                   assignment=node_assignment(text, placed.pod_key))


def node_verdict(world: World) -> str | None:
    """The node's check of every container of the new pod (Allocate is asked once per container)."""
    listed = world.listed or world.cards
    inventory = GpuInventory(listed, Topology.flat(len(listed)), tuple(f"/dev/nvidia{c.index}" for c in listed))
    pod = node_view(world, world.pod)
    owners = [node_view(world, p) for p in world.owners]
    borrowers = [node_view(world, p) for p in world.borrowers]
    assert pod.assignment is not None
    try:
        for one in pod.assignment.placement.containers:
            if world.borrows:
                check_borrower(NODE, inventory, pod, one, world.loans, borrowers)
            else:
                check_assignment(NODE, inventory, pod, one, owners)
    except AssignmentRefused as exc:
        return str(exc)
    return None


def _world(card_list: tuple[GpuCard, ...], loans: tuple[LendableCard, ...], borrowers: tuple[Placement, ...],
           pod: Placement) -> World:
    return World(card_list, (), loans, borrowers, pod, True)


_T4 = (GpuCard(2, "GPU-2", "T4", 16384), GpuCard(5, "GPU-5", "T4", 16384))
_LOAN = (LendableCard(5, "GPU-5", OWNER, "main", 8192, 50, 0.0),)


def _on(pos: int, memory: int, compute: int = 0, exclusive: bool = False, key: str = "default/new") -> Placement:
    return Placement(key, NODE, 0, 0, (ContainerAssignment("c0", (CardSlice(pos, memory, compute, exclusive),)),))


#: Cases the node's earlier borrower check granted and the core refuses.
WEAKER_BEFORE = {
    "second-borrower-over-fills-the-loan-memory": _world(_T4, _LOAN, (_on(1, 6144, key="default/b0"),), _on(1, 4096)),
    "borrower-over-the-loan-compute": _world(_T4, _LOAN, (), _on(1, 1024, compute=600)),
    "borrowers-over-the-loan-compute-together": _world(_T4, _LOAN, (_on(1, 1024, 300, key="default/b0"),),
                                                       _on(1, 1024, compute=300)),
    "borrower-asks-the-whole-lent-card": _world(_T4, (dataclasses.replace(_LOAN[0], memory_mib=16384),), (),
                                                _on(1, 16384, 1000, exclusive=True)),
    "borrower-on-an-unhealthy-lent-card": _world((_T4[0], dataclasses.replace(_T4[1], healthy=False)), _LOAN, (),
                                                 _on(1, 1024)),
    "borrower-on-a-card-no-longer-lent": _world(_T4, (), (_on(1, 1024, key="default/b0"),), _on(1, 1024)),
}


@pytest.mark.parametrize("world", [pytest.param(w, id=k) for k, w in WEAKER_BEFORE.items()])
def test_the_node_refuses_what_the_core_refuses_where_it_was_weaker(world: World) -> None:
    reason = node_verdict(world)
    assert extender_verdict(world) is not None and reason is not None
    assert "card 5 (GPU-5)" in reason


def test_a_borrower_refusal_names_the_loan_the_amounts_and_the_borrowers() -> None:
    reason = node_verdict(WEAKER_BEFORE["second-borrower-over-fills-the-loan-memory"])
    assert reason == ("card 5 (GPU-5) lent by default/owner would be over-lent: 4096 MiB asked, 6144 MiB of "
                      "the loan's 8192 MiB already granted to default/b0")
    reason = node_verdict(WEAKER_BEFORE["borrowers-over-the-loan-compute-together"])
    assert reason == ("card 5 (GPU-5) lent by default/owner would be over-lent: 30 % compute asked, 30 % of "
                      "the loan's 50 % already granted to default/b0")


def test_a_borrower_fitting_beside_the_others_is_granted_on_the_card_by_its_index() -> None:
    """Card 5 is ledger position 1: the loan, the borrowers and the pod all name it by index on the node."""
    world = _world(_T4, _LOAN, (_on(1, 4096, 200, key="default/b0"),), _on(1, 4096, 300))
    assert extender_verdict(world) is None and node_verdict(world) is None


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
@example(WEAKER_BEFORE["second-borrower-over-fills-the-loan-memory"])
def test_the_node_and_the_extender_give_the_same_verdict(world: World) -> None:
    core, node = extender_verdict(world), node_verdict(world)
    assert (core is None) == (node is None), f"extender: {core!r}; node: {node!r}"
