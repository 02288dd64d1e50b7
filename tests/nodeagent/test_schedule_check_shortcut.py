"""The schedule check's shortcut where no other grant holds the container's cards gives the answer
of the one-node ledger it skips building.

``check_assignment`` asks the core's card rule about an idle card directly when no other granted
pod holds a slice of the container's cards (:func:`refuse_on_idle_cards`); these tests draw
inventories (cards of several sizes, unhealthy ones) and granted pods (on the same cards or
others, finished ones, other nodes' assignments) and compare its verdict and sentence with the
ledger's (the check as it was before the shortcut, written out below).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, Placement, Topology
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.kept_ledger import KeptLedger
from gpupool.nodeagent.schedule_check import (
    AssignmentRefused,
    NodeLedger,
    check_assignment,
    refuse_card_states,
    refuse_foreign,
)
from gpupool.nodeagent.types import NodeAssignment, PodView

NODE = "node-a"


def ledger_check(inventory: GpuInventory, pod: PodView, container: ContainerAssignment,
                 granted: list[PodView]) -> None:
    """The check with the ledger always built (``check_assignment`` before the shortcut)."""
    refuse_foreign(pod)
    ledger = NodeLedger.of(NODE, inventory)
    refuse_card_states(NODE, ledger.cards, container)
    if pod.assignment is None:
        return
    for other in granted:
        if other.uid != pod.uid:
            ledger.claim(other)
    ledger.refuse_owner(pod, container)


def outcome(check: Any, *args: Any) -> tuple[str, str]:
    try:
        check(*args)
    except AssignmentRefused as exc:
        return type(exc).__name__, str(exc)
    return "granted", ""


cards = st.lists(st.tuples(st.sampled_from([8192, 16384]), st.booleans()), min_size=1, max_size=3)
slices = st.builds(lambda card, mib, compute, whole: CardSlice(card, mib, compute, whole),
                   st.integers(0, 3), st.sampled_from([0, 1024, 4096, 8192, 12288, 16384, 20000]),
                   st.sampled_from([0, 100, 300, 600, 1000]), st.booleans())
containers = st.lists(st.tuples(st.booleans(), st.lists(slices, min_size=1, max_size=2)), min_size=1, max_size=3)


def view(name: str, drawn: list[tuple[bool, list[CardSlice]]], *, node: str = NODE, terminated: bool = False,
         uid: str | None = None) -> PodView:
    found = tuple(ContainerAssignment(f"c{i}", tuple(s), init=init) for i, (init, s) in enumerate(drawn))
    placement = Placement(f"default/{name}", node, 0, 0, found)
    return PodView("default", name, uid or f"uid-{name}", NODE, 0.0, terminated, (),
                   NodeAssignment(placement, {}, pod_uid=uid or f"uid-{name}"))


others = st.lists(st.tuples(containers, st.sampled_from([NODE, "", "node-b"]), st.booleans()), max_size=3)


@settings(max_examples=400, deadline=None)
@given(cards, containers, st.integers(0, 2), others)
def test_the_shortcut_refuses_and_grants_as_the_ledger_does(
        drawn_cards: list[tuple[int, bool]], drawn_pod: list[tuple[bool, list[CardSlice]]], which: int,
        drawn_others: list[tuple[list[tuple[bool, list[CardSlice]]], str, bool]]) -> None:
    inventory = GpuInventory(tuple(GpuCard(i, f"GPU-{i}", "T4", mib, healthy=ok)
                                   for i, (mib, ok) in enumerate(drawn_cards)),
                             Topology.flat(len(drawn_cards)), tuple(f"/dev/nvidia{i}" for i in range(len(drawn_cards))))
    pod = view("p", drawn_pod)
    assert pod.assignment is not None
    container = pod.assignment.placement.containers[which % len(drawn_pod)]
    granted = [view(f"o{i}", c, node=node, terminated=done) for i, (c, node, done) in enumerate(drawn_others)]
    granted.append(view("p", drawn_pod))  # the pod itself is never another holder
    assert (outcome(check_assignment, NODE, inventory, pod, container, granted)
            == outcome(ledger_check, inventory, pod, container, granted))


def test_a_container_alone_on_its_cards_is_checked_without_a_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = GpuInventory((GpuCard(0, "GPU-0", "T4", 16384), GpuCard(1, "GPU-1", "T4", 16384)),
                             Topology.flat(2), ("/dev/nvidia0", "/dev/nvidia1"))
    pod = view("p", [(False, [CardSlice(0, 20000, 300, False)])])
    neighbour = view("q", [(False, [CardSlice(1, 8192, 300, False)])])
    assert pod.assignment is not None
    container = pod.assignment.placement.containers[0]

    def built(*args: Any) -> NodeLedger:
        raise AssertionError("the ledger was built")

    monkeypatch.setattr(NodeLedger, "of", built)
    with pytest.raises(AssignmentRefused, match="20000 MiB asked, 0 MiB of 16384 MiB already granted to no other pod"):
        check_assignment(NODE, inventory, pod, container, [neighbour])
    sharing = view("r", [(False, [CardSlice(0, 1024, 100, False)])])
    with pytest.raises(AssertionError, match="ledger was built"):  # a card held by another: the ledger decides
        check_assignment(NODE, inventory, pod, container, [neighbour, sharing])


pools = st.lists(st.tuples(containers, st.booleans()), min_size=1, max_size=6)
steps = st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 5), unique=True), containers, st.integers(0, 2),
                           st.booleans()), min_size=1, max_size=6)


def inventory_of(drawn_cards: list[tuple[int, bool]]) -> GpuInventory:
    return GpuInventory(tuple(GpuCard(i, f"GPU-{i}", "T4", mib, healthy=ok) for i, (mib, ok) in enumerate(drawn_cards)),
                        Topology.flat(len(drawn_cards)), tuple(f"/dev/nvidia{i}" for i in range(len(drawn_cards))))


@settings(max_examples=200, deadline=None)
@given(cards, pools, steps)
def test_the_kept_ledger_checks_as_a_rebuilt_one(drawn_cards: list[tuple[int, bool]],
                                                 pool: list[tuple[list[tuple[bool, list[CardSlice]]], bool]],
                                                 drawn_steps: list[tuple[bool, list[int], Any, int, bool]]) -> None:
    """Checks one after another with granted lists that grow (the kept ledger claims the rest) or
    change otherwise, on the inventory drawn or one whose cards changed size (it builds afresh):
    every answer is the one-time ledger's."""
    inventories = (inventory_of(drawn_cards), inventory_of([(24576 - mib, ok) for mib, ok in drawn_cards]))
    views = [view(f"o{i}", c, terminated=done) for i, (c, done) in enumerate(pool)]
    kept = KeptLedger(NODE)
    order: list[int] = []
    for grows, picked, drawn_pod, which, resized in drawn_steps:
        inventory = inventories[resized]
        wanted = list(dict.fromkeys(i % len(views) for i in picked))
        order = [*order, *(i for i in wanted if i not in order)] if grows else wanted
        granted = [views[i] for i in order]
        pod = view("p", drawn_pod)
        assert pod.assignment is not None
        container = pod.assignment.placement.containers[which % len(drawn_pod)]
        assert (outcome(check_assignment, NODE, inventory, pod, container, granted, kept)
                == outcome(ledger_check, inventory, pod, container, granted))


def test_pods_granted_one_after_another_extend_the_kept_ledger() -> None:
    """Allocate's use: each pod checked against those granted before it, on one kept ledger built
    once; its refusal names the holders as a rebuilt ledger's would (the kept ledger's own rules:
    ``tests/nodeagent/test_kept_ledger.py``)."""
    inventory = GpuInventory((GpuCard(0, "GPU-0", "T4", 16384),), Topology.flat(1), ("/dev/nvidia0",))
    pods = [view(f"p{i}", [(False, [CardSlice(0, 3072, 200, False)])]) for i in range(5)]
    kept = KeptLedger(NODE)
    for i, pod in enumerate(pods[1:], start=1):
        assert pod.assignment is not None
        check_assignment(NODE, inventory, pod, pod.assignment.placement.containers[0], pods[:i], kept)
    assert kept.rebuilds == 1
    last = view("p5", [(False, [CardSlice(0, 3072, 200, False)])])
    assert last.assignment is not None
    with pytest.raises(AssignmentRefused, match="15360 MiB of 16384 MiB already granted to default/p0, default/p1"):
        check_assignment(NODE, inventory, last, last.assignment.placement.containers[0], pods, kept)
    assert kept.rebuilds == 1
    finished = [*pods[:4], view("p4", [(False, [CardSlice(0, 3072, 200, False)])], terminated=True)]
    check_assignment(NODE, inventory, last, last.assignment.placement.containers[0], finished, kept)
    assert kept.rebuilds == 2  # a pod that ended releases its cards: built afresh


def test_the_node_claims_its_grants_without_looking_for_cards_over_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent claims every pod it granted and judges a new slice by the cards' free space: the
    core's over-capacity walk over the node's placements (the extender's concern) is not run on
    Allocate's path, nor on a rebuild that claims every granted pod."""
    def walked(*_args: Any) -> tuple[int, ...]:
        raise AssertionError("the node's claim walked its placements for cards over capacity")

    monkeypatch.setattr("gpupool.core.state.cards_over_capacity", walked)
    inventory = GpuInventory((GpuCard(0, "GPU-0", "T4", 16384),), Topology.flat(1), ("/dev/nvidia0",))
    pods = [view(f"p{i}", [(False, [CardSlice(0, 3072, 200, False)])]) for i in range(6)]
    kept = KeptLedger(NODE)
    for i, pod in enumerate(pods[1:5], start=1):
        assert pod.assignment is not None
        check_assignment(NODE, inventory, pod, pod.assignment.placement.containers[0], pods[:i], kept)
    last = pods[5]
    assert last.assignment is not None
    with pytest.raises(AssignmentRefused, match="already granted"):
        check_assignment(NODE, inventory, last, last.assignment.placement.containers[0], pods[:5], kept)
    assert kept.rebuilds == 1
