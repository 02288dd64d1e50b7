"""Node updates are all-or-nothing: a description the ledger cannot hold changes nothing.

The model refuses out-of-bounds numbers (tests/core/test_model.py); these tests push such a number
past it (as a caller that built the spec some other way could) to show the ledger's own guarantee.
A half-written node used to look unchanged to the caller's retry and was never repaired.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from gpupool.core.model import NodeSpec
from gpupool.core.state import ClusterState
from tests.core.builders import book_slice, book_whole, make_node

HUGE_MIB = 10**30


def with_card_memory(spec: NodeSpec, card: int, memory_mib: int) -> NodeSpec:
    """``spec`` with one card's memory set to a value the model would refuse (bypassing it)."""
    object.__setattr__(spec.cards[card], "memory_mib", memory_mib)
    return spec


def everything(state: ClusterState) -> dict[str, Any]:
    """Copies of every array, list and counter of the ledger, to compare states exactly."""
    arrays = {name: getattr(state, name).copy() for name in (*state._NODE_ARRAYS, *state._CARD_ARRAYS)}
    return {**arrays, "specs": list(state.specs), "index": dict(state.index), "models": list(state.models),
            "placements": dict(state.placements), "pods_on": {r: set(k) for r, k in state.pods_on.items()},
            "version": state.version, "layout_version": state.layout_version, "max_cards": state.max_cards,
            "capacity": state.capacity()}


def assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    for name, old in before.items():
        if isinstance(old, np.ndarray):
            np.testing.assert_array_equal(after[name], old, err_msg=name)
        else:
            assert after[name] == old, name


@pytest.fixture
def state() -> ClusterState:
    state = ClusterState([make_node("n0", 2, cpu=8_000), make_node("n1", 2)])
    book_slice(state, "a", "n0", 0, compute=300, memory=4_000, cpu=1_000)
    book_whole(state, "w", "n0", 1)
    return state


@pytest.mark.parametrize(
    "update",
    [
        pytest.param(lambda s: s.upsert_node(with_card_memory(make_node("n0", 2, model="NEW"), 1, HUGE_MIB)),
                     id="known-node-second-card"),
        pytest.param(lambda s: s.upsert_node(with_card_memory(make_node("n9", 12, model="NEW"), 11, HUGE_MIB)),
                     id="new-wider-node"),
        pytest.param(lambda s: s.add_nodes([make_node("n1", 3), make_node("n8", 1),
                                            with_card_memory(make_node("n9", 2), 0, HUGE_MIB)]),
                     id="list-with-one-bad-node-last"),
    ],
)
def test_a_failed_update_leaves_the_ledger_exactly_as_before(state: ClusterState,
                                                            update: Callable[[ClusterState], object]) -> None:
    before = everything(state)
    with pytest.raises(ValueError, match=r"cards\.memoryMiB does not fit the ledger"):
        update(state)
    assert_same(before, everything(state))


def test_the_retry_of_a_failed_update_applies_cleanly(state: ClusterState) -> None:
    with pytest.raises(ValueError, match=r"node n0: cards\.memoryMiB"):
        state.upsert_node(with_card_memory(make_node("n0", 2, cpu=16_000), 0, HUGE_MIB))
    assert int(state.cpu_free[0]) == 7_000  # not "0m CPU free" from a half-written row

    assert state.upsert_node(make_node("n0", [32_768, 32_768], cpu=16_000)) == 0
    assert int(state.cpu_free[0]) == 15_000
    assert state.card_mem_free[0, :2].tolist() == [28_768, 0]  # bookings re-applied on the new cards
    assert state.card_compute_free[0, :2].tolist() == [700, 0]


def test_a_failed_growth_of_the_arrays_changes_nothing(state: ClusterState,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Growing swaps every buffer at once: an allocation failing half-way leaves the old ones."""
    before = everything(state)
    real_full = np.full
    calls = {"n": 0}

    def full_failing_on_the_third(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise MemoryError("simulated")
        return real_full(*args, **kwargs)

    monkeypatch.setattr(np, "full", full_failing_on_the_third)
    with pytest.raises(MemoryError):
        state.upsert_node(make_node("wide", 12))
    monkeypatch.undo()
    assert_same(before, everything(state))
    assert state.upsert_node(make_node("wide", 12)) == 2
    book_slice(state, "b", "n1", 0, compute=100)  # the old rows still book into the arrays in use
    assert int(state.card_compute_free[1, 0]) == 900
