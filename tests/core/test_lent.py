"""Lent cards in the ledger: borrowers count against the loan, never against what owners book."""

from __future__ import annotations

import dataclasses

import pytest

from gpupool.core.lent import LentState, Loan
from gpupool.core.lent_view import lent_assign, lent_fit
from gpupool.core.model import CardSlice, GpuRequest, Placement
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import AllocationError, ClusterState
from tests.core.builders import book_whole, make_node, mem_pod, pod_with, raw_placement

OWNER = "team/owner"


def lending_cluster(lent_mib: int = 8_000, compute: int = 1_000) -> ClusterState:
    """Node n1: card 0 held whole by its owner and lent; card 1 held whole and not lent."""
    state = ClusterState([make_node("n1", 2)])
    book_whole(state, OWNER, "n1", 0)
    book_whole(state, "team/other", "n1", 1)
    state.set_loans("n1", [Loan(0, OWNER, lent_mib, compute)])
    return state


def lent_slice(key: str, card: int, mib: int) -> Placement:
    return dataclasses.replace(raw_placement(key, "n1", [CardSlice(card, mib, 0)]), borrowed_from=OWNER)


def borrow(state: ClusterState, key: str, mib: int, compute: int = 0) -> Placement:
    decision = lent_assign(state, mem_pod(key, mib, compute=compute), "n1", make_policy("bestfit"))
    assert isinstance(decision, Placement), decision
    state.apply(decision)
    return decision


def test_a_borrower_is_placed_on_the_loan_of_a_card_its_owner_holds_whole() -> None:
    state = lending_cluster()
    assert isinstance(Scheduler(state, make_policy("bestfit")).assign(mem_pod("b/1", 4_000), "n1"), Unschedulable)
    placed = borrow(state, "b/1", 4_000)
    assert placed.borrowed_from == OWNER
    assert placed.containers[0].cards == (0,)
    assert state.lent.free(0, 0) == (4_000, 1_000)
    assert state.card_usage("n1")[0].memory_free == 0  # the owners' side is untouched
    assert state.over_capacity("n1") == ()


def test_borrowers_never_exceed_the_loan() -> None:
    state = lending_cluster(lent_mib=8_000)
    borrow(state, "b/1", 5_000)
    refused = lent_assign(state, mem_pod("b/2", 4_000), "n1", make_policy("bestfit"))
    assert isinstance(refused, Unschedulable)
    assert "lent capacity" in refused.reason
    with pytest.raises(AllocationError, match="MiB of its loan free"):
        state.apply(lent_slice("b/2", 0, 4_000))


def test_compute_of_the_loan_is_a_budget_too() -> None:
    state = lending_cluster(compute=500)
    borrow(state, "b/1", 1_000, compute=400)
    assert isinstance(lent_assign(state, mem_pod("b/2", 1_000, compute=200), "n1", make_policy("bestfit")),
                      Unschedulable)


@pytest.mark.parametrize("request_", [
    pytest.param(GpuRequest.whole(), id="whole-card"),
    pytest.param(GpuRequest(compute=100, memory_mib=1_000, count=2), id="more-cards-than-lent"),
])
def test_requests_a_loan_cannot_serve_are_refused(request_: GpuRequest) -> None:
    state = lending_cluster()
    assert isinstance(lent_assign(state, pod_with("b/1", request_), "n1", make_policy("bestfit")), Unschedulable)


def test_a_card_that_is_not_lent_takes_no_borrower() -> None:
    state = lending_cluster()
    assert state.check(lent_slice("b/1", 1, 1_000)) == "node n1 card 1 is not lent"


def test_withdrawn_loan_keeps_its_borrowers_and_takes_no_new_one() -> None:
    state = lending_cluster()
    borrow(state, "b/1", 2_000)
    state.set_loans("n1", [])
    assert state.lent.state(0, 0) is LentState.WITHDRAWN
    assert "b/1" in state.placements
    assert state.lent.over_loan(0) == (0,)
    assert lent_assign(state, mem_pod("b/2", 1_000), "n1", make_policy("bestfit")) == \
        Unschedulable("b/2", "no card of this node is lent")
    state.release("b/1")
    assert state.lent.state(0, 0) is LentState.NOT_LENT


def test_normal_pods_never_land_on_lent_capacity() -> None:
    state = lending_cluster()
    assert isinstance(Scheduler(state, make_policy("bestfit")).decide(mem_pod("p/1", 1_000)), Unschedulable)


def test_loans_move_the_node_version_and_survive_a_node_update() -> None:
    state = lending_cluster()
    borrow(state, "b/1", 2_000)
    before = int(state.node_version[0])
    state.set_loans("n1", [Loan(0, OWNER, 6_000, 1_000)])
    assert int(state.node_version[0]) > before
    state.upsert_node(make_node("n1", 2))  # re-books every placement: the borrower once
    assert state.lent.free(0, 0) == (4_000, 1_000)
    state.remove_node("n1")
    assert state.lent.lending_rows() == [] and state.lent.borrowed(0, 0) == (0, 0)


def test_the_filter_on_lent_capacity_names_why_a_node_cannot_lend() -> None:
    state = lending_cluster()
    state.add_nodes([make_node("n2", 1)])
    fit = lent_fit(state, mem_pod("b/1", 4_000), [0, 1], make_policy("bestfit"))
    assert fit.rows.tolist() == [0]
    assert fit.reasons == {1: "no card of this node is lent"}
    too_big = lent_fit(state, mem_pod("b/1", 9_000), [0], make_policy("bestfit"))
    assert too_big.rows.tolist() == [] and "lent capacity" in too_big.reasons[0]


def test_a_borrowed_placement_is_equal_only_with_its_owner() -> None:
    plain = raw_placement("b/1", "n1", [CardSlice(0, 1_000, 0)])
    assert dataclasses.replace(plain, borrowed_from=OWNER) != plain
