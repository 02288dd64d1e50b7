"""Claims: bookings the cluster already holds count even beyond a card's capacity, and an
over-committed card takes nothing new until it is back within its capacity."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.feasibility import node_fit_mask
from gpupool.core.model import CardMode, CardSlice, Placement, PodRequest
from gpupool.core.state import AllocationError, ClusterState
from tests.core.builders import CARD_MIB, make_node, mem_pod, raw_placement, rows, slice_pod

GIB = 1024


def twelve_gib(card: int = 0) -> CardSlice:
    return CardSlice(card, 12 * GIB, 0)


def test_two_claims_beyond_a_card_are_both_booked_and_reported() -> None:
    state = ClusterState([make_node("n1", 2)])
    state.claim(raw_placement("a", "n1", [twelve_gib()], cpu=2_000))
    assert state.over_capacity("n1") == ()
    state.claim(raw_placement("b", "n1", [twelve_gib()], cpu=3_000))
    usage = state.card_usage("n1")[0]
    assert usage.memory_free == CARD_MIB - 24 * GIB  # below zero: every claim counts
    assert int(state.cpu_free[0]) == 64_000 - 5_000
    assert set(state.placements) == {"a", "b"}
    assert state.over_capacity("n1") == (0,)


@pytest.mark.parametrize("request_", [
    pytest.param(mem_pod("small", 1 * GIB), id="a-small-memory-slice"),
    pytest.param(mem_pod("compute-only", 0, compute=100), id="compute-only"),
    pytest.param(slice_pod("whole", 1000), id="a-whole-card"),
])
def test_an_over_committed_card_takes_nothing_new(request_: PodRequest) -> None:
    state = ClusterState([make_node("n1", 1)])
    state.claim(raw_placement("a", "n1", [twelve_gib()]))
    state.claim(raw_placement("b", "n1", [twelve_gib()]))
    assert not node_fit_mask(state, request_, rows(0)).any()


def test_releasing_one_claimant_leaves_the_other_booked() -> None:
    state = ClusterState([make_node("n1", 1)])
    state.claim(raw_placement("a", "n1", [twelve_gib()]))
    state.claim(raw_placement("b", "n1", [twelve_gib()]))
    state.release("a")
    assert state.over_capacity("n1") == ()
    assert state.card_usage("n1")[0].memory_free == CARD_MIB - 12 * GIB
    assert not node_fit_mask(state, mem_pod("big", 12 * GIB), rows(0)).any()
    assert node_fit_mask(state, mem_pod("fits", 4 * GIB), rows(0)).all()


def test_a_whole_card_shared_with_a_slice_is_over_capacity() -> None:
    state = ClusterState([make_node("n1", 1)])
    state.claim(raw_placement("whole", "n1", [CardSlice(0, CARD_MIB, 1000, exclusive=True)]))
    state.claim(raw_placement("slice", "n1", [CardSlice(0, 1 * GIB, 0)]))
    assert state.over_capacity("n1") == (0,)
    state.release("slice")
    state.upsert_node(state.specs[0])  # what the extender does after a release from such a card
    assert state.card_usage("n1")[0].mode == CardMode.EXCLUSIVE
    assert state.over_capacity("n1") == ()


@pytest.mark.parametrize(("placement", "message"), [
    pytest.param(raw_placement("x", "nowhere", [CardSlice(0, 1, 0)]), "not known", id="unknown-node"),
    pytest.param(raw_placement("x", "n1", [CardSlice(5, 1, 0)]), "no card 5", id="unknown-card"),
    pytest.param(raw_placement("a", "n1", [CardSlice(1, 1, 0)]), "already holds", id="booked-twice"),
])
def test_a_claim_of_what_cannot_exist_is_refused_and_books_nothing(placement: Placement, message: str) -> None:
    state = ClusterState([make_node("n1", 2)])
    state.claim(raw_placement("a", "n1", [CardSlice(0, 1, 0)]))
    before = state.card_mem_free.copy()
    with pytest.raises(AllocationError, match=message):
        state.claim(placement)
    assert np.array_equal(state.card_mem_free, before)
