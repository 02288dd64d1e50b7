"""The node's kept ledger (:class:`KeptLedger`) is exactly the ledger a rebuild makes.

The device plugin's Allocate lists the granted pods on each check (a list that grows as pods are
admitted, or changes otherwise); the DRA driver's prepare lists the device plugin's pods and
appends each claim it prepares between checks, and forgets the ledger on an unprepare. These tests
draw such sequences (on an inventory that changes too) and compare the kept ledger, array by
array, with one built afresh for the check; the callers' own tests are
``tests/nodeagent/test_schedule_check_shortcut.py`` (Allocate) and
``tests/nodeagent/dra/test_prepare_ledger_kept.py`` (prepare).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.model import CardSlice
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.kept_ledger import KeptLedger
from gpupool.nodeagent.schedule_check import NodeLedger
from gpupool.nodeagent.types import PodView
from tests.nodeagent.test_schedule_check_shortcut import NODE, cards, containers, inventory_of, view


def fingerprint(ledger: NodeLedger) -> tuple[Any, ...]:
    """Everything a check reads of ``ledger``: the row's card arrays, the placements, the holders."""
    state = ledger.state
    arrays = tuple(tuple(getattr(state, name)[NodeLedger.ROW].tolist()) for name in state._CARD_ARRAYS)
    return (ledger.cards, arrays, dict(state.placements), dict(state.pods_on), ledger.holders, ledger.borrowers)


def made(pod: PodView) -> Callable[[GpuInventory], PodView]:
    """What a caller appends: ``pod``'s view, whatever the inventory."""
    return lambda _inventory: pod


def listing(pods: list[PodView]) -> Callable[[], list[PodView]]:
    """What a caller lists as appended, to build the ledger afresh."""
    return lambda: pods


def rebuilt(inventory: GpuInventory, listed: list[PodView], appended: list[PodView]) -> NodeLedger:
    ledger = NodeLedger.of(NODE, inventory)
    for pod in [*listed, *appended]:
        ledger.claim(pod)
    return ledger


pool = st.lists(st.tuples(containers, st.booleans()), min_size=1, max_size=6)
step: st.SearchStrategy[tuple[str, bool, list[int]]] = st.one_of(
    st.tuples(st.just("list"), st.booleans(), st.lists(st.integers(0, 5), unique=True)),
    st.tuples(st.just("append"), st.booleans(), st.lists(st.integers(0, 5), min_size=1, max_size=1)),
    st.tuples(st.just("release"), st.booleans(), st.lists(st.integers(0, 5), min_size=1, max_size=1)),
    st.tuples(st.just("resize"), st.booleans(), st.just([])),
)


@settings(max_examples=200, deadline=None)
@given(cards, pool, st.lists(step, min_size=1, max_size=10))
def test_the_kept_ledger_is_the_ledger_a_rebuild_makes(drawn_cards: list[tuple[int, bool]],
                                                       drawn_pool: list[tuple[Any, bool]],
                                                       steps: list[tuple[str, bool, list[int]]]) -> None:
    """Listed pods that grow (claimed on the kept ledger) or change otherwise, pods appended between
    checks and released (forget), another inventory: after every step the kept ledger equals one
    built afresh from the listed pods then the appended ones, in that order."""
    inventories = (inventory_of(drawn_cards), inventory_of([(24576 - mib, ok) for mib, ok in drawn_cards]))
    listable = [view(f"o{i}", c, terminated=done) for i, (c, done) in enumerate(drawn_pool)]
    appendable = [view(f"t{i}", c) for i, (c, _) in enumerate(drawn_pool)]
    kept = KeptLedger(NODE)
    order: list[int] = []
    tail: list[int] = []
    inventory = inventories[0]
    for kind, flag, picked in steps:
        if kind == "list":
            wanted = list(dict.fromkeys(i % len(listable) for i in picked))
            order = [*order, *(i for i in wanted if i not in order)] if flag else wanted
        elif kind == "append":
            pod = appendable[picked[0] % len(appendable)]
            if picked[0] % len(appendable) not in tail:
                tail.append(picked[0] % len(appendable))
                kept.append(made(pod))
        elif kind == "release" and tail:
            tail.pop(picked[0] % len(tail))
            kept.forget()
        elif kind == "resize":
            inventory = inventories[flag]
        listed, appended = [listable[i] for i in order], [appendable[i] for i in tail]
        got = kept.ledger(inventory, listed, listing(appended))
        assert fingerprint(got) == fingerprint(rebuilt(inventory, listed, appended))


def one_card(mib: int = 16384) -> GpuInventory:
    return inventory_of([(mib, True)])


def slice_pod(name: str, *, terminated: bool = False) -> PodView:
    return view(name, [(False, [CardSlice(0, 3072, 200, False)])], terminated=terminated)


def test_listed_pods_that_grow_are_claimed_on_the_kept_ledger_and_any_other_change_builds_it() -> None:
    pods = [slice_pod(f"p{i}") for i in range(5)]
    kept = KeptLedger(NODE)
    for i in range(len(pods) + 1):
        kept.ledger(one_card(), pods[:i])
    assert kept.rebuilds == 1
    finished = [*pods[:4], slice_pod("p4", terminated=True)]
    kept.ledger(one_card(), finished)
    assert kept.rebuilds == 2  # a pod that ended releases its cards
    kept.ledger(one_card(32768), finished)
    assert kept.rebuilds == 3  # another inventory
    kept.ledger(one_card(32768), finished[1:])
    assert kept.rebuilds == 4  # a pod gone


def test_appended_pods_are_claimed_after_the_listed_ones_until_the_list_grows_or_one_is_released() -> None:
    listed, claims = [slice_pod("p0")], [slice_pod(f"c{i}") for i in range(3)]
    kept = KeptLedger(NODE)
    kept.ledger(one_card(), listed, lambda: claims[:1])
    for i in (1, 2):
        kept.append(made(claims[i]))
        ledger = kept.ledger(one_card(), listed, listing(claims[:i + 1]))
    assert kept.rebuilds == 1
    assert ledger.holders == {0: ["default/p0", "default/c0", "default/c1", "default/c2"]}
    grown = [*listed, slice_pod("p1")]
    assert kept.ledger(one_card(), grown, lambda: claims).holders == {
        0: ["default/p0", "default/p1", "default/c0", "default/c1", "default/c2"]}  # as a rebuild orders them
    assert kept.rebuilds == 2
    kept.forget()
    assert kept.ledger(one_card(), grown, lambda: claims[1:]).holders == {
        0: ["default/p0", "default/p1", "default/c1", "default/c2"]}
    assert kept.rebuilds == 3


def test_nothing_is_appended_to_a_ledger_not_kept() -> None:
    kept = KeptLedger(NODE)
    kept.append(lambda _inventory: slice_pod("c0"))  # no check yet: the first builds it with appended()
    assert kept.ledger(one_card(), [], list).holders == {}
    assert kept.rebuilds == 1


def test_a_pod_the_kept_ledger_cannot_append_drops_it_instead_of_failing_the_caller() -> None:
    kept = KeptLedger(NODE)
    kept.ledger(one_card(), [], list)

    def broken(_: GpuInventory) -> PodView:
        raise ValueError("no view")

    kept.append(broken)
    kept.ledger(one_card(), [], list)
    assert kept.rebuilds == 2


def test_a_listed_pod_that_cannot_be_claimed_raises_and_drops_the_kept_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = KeptLedger(NODE)
    pods = [slice_pod("p0"), slice_pod("p1")]
    kept.ledger(one_card(), pods[:1])
    real = NodeLedger.claim

    def refuse(self: NodeLedger, pod: PodView) -> None:
        if pod.name == "p1":
            raise RuntimeError("cannot claim")
        real(self, pod)

    monkeypatch.setattr(NodeLedger, "claim", refuse)
    with pytest.raises(RuntimeError, match="cannot claim"):
        kept.ledger(one_card(), pods)
    monkeypatch.setattr(NodeLedger, "claim", real)
    assert kept.ledger(one_card(), pods).holders == {0: ["default/p0", "default/p1"]}
    assert kept.rebuilds == 2


def test_a_card_that_turns_unhealthy_builds_the_ledger_afresh() -> None:
    kept = KeptLedger(NODE)
    kept.ledger(one_card(), [slice_pod("p0")])
    sick = inventory_of([(16384, False)])
    assert not kept.ledger(sick, [slice_pod("p0")]).state.card_healthy[NodeLedger.ROW, 0]
    assert kept.rebuilds == 2
