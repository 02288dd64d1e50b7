"""What-if copies: the nodes' bookings on a private ledger, so questions never touch the shared one."""

from __future__ import annotations

import numpy as np

from gpupool.core.model import CardSlice
from gpupool.core.state import ClusterState
from gpupool.core.what_if import what_if_copy
from tests.core.builders import CARD_MIB, book_slice, book_whole, ledger_snapshot, make_node, raw_placement


def shared_ledger() -> ClusterState:
    state = ClusterState([make_node("n1", 2), make_node("n2", 2), make_node("n3", 1)])
    book_slice(state, "a", "n1", 0, memory=4_000, cpu=2_000)
    book_whole(state, "b", "n1", 1)
    book_slice(state, "c", "n2", 1, memory=8_000, compute=300)
    state.claim(raw_placement("d", "n3", [CardSlice(0, 12_000, 0)]))
    state.claim(raw_placement("e", "n3", [CardSlice(0, 12_000, 0)]))  # over-committed claims copy too
    state.set_card_health("n2", 0, False)
    return state


def test_a_copy_holds_the_nodes_bookings_exactly() -> None:
    state = shared_ledger()
    copy = what_if_copy(state, ["n1", "n2", "n3"])
    for name in ("n1", "n2", "n3"):
        assert copy.card_usage(name) == state.card_usage(name)
        assert int(copy.cpu_free[copy.index[name]]) == int(state.cpu_free[state.index[name]])
    assert copy.placements == state.placements
    assert copy.over_capacity("n3") == (0,)


def test_a_copy_without_some_pods_and_its_bookings_leave_the_shared_ledger_alone() -> None:
    state = shared_ledger()
    before = ledger_snapshot(state)
    versions = (state.version, state.layout_version, state.node_version.copy())
    copy = what_if_copy(state, ["n1", "unknown"], without={"b", "c"})
    assert list(copy.index) == ["n1"]  # only the present nodes asked for
    assert set(copy.placements) == {"a"}
    assert copy.card_usage("n1")[1].memory_free == CARD_MIB
    book_whole(copy, "new", "n1", 1)
    copy.release("a")
    after = ledger_snapshot(state)
    assert all(np.array_equal(before[name], after[name]) for name in before)
    assert (state.version, state.layout_version) == versions[:2]
    assert np.array_equal(state.node_version, versions[2])
    assert set(state.placements) == {"a", "b", "c", "d", "e"}
