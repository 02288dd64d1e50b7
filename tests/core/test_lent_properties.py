"""Owners and borrowers never hold more of a card than the ledger allows (hypothesis).

Random steps on one node of three cards: owners booked by the scheduler, loans published, shrunk
and withdrawn, borrowers placed on lent capacity (and some placed by hand, past the loan, which the
ledger must refuse), pods leaving. After every step: the owners' bookings fit every card (the card
rule), and every card's borrowers fit its loan unless the loan shrank or went since they were
booked; a card whose loan shrank takes no new borrower until enough have left.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpupool.core.lent import Loan
from gpupool.core.lent_view import lent_assign
from gpupool.core.model import CardSlice, GpuRequest, Placement
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import AllocationError, ClusterState
from tests.core.builders import make_node, pod_with, raw_placement

CARDS = 3
CARD = 16_384
OWNER = "team/owner"

steps = st.lists(st.one_of(
    st.tuples(st.just("owner"), st.integers(1, 1000), st.booleans()),
    st.tuples(st.just("loan"), st.integers(0, CARDS - 1), st.integers(0, CARD), st.integers(0, 1000)),
    st.tuples(st.just("withdraw"), st.integers(0, CARDS - 1)),
    st.tuples(st.just("borrow"), st.integers(1, CARD), st.integers(0, 1000)),
    st.tuples(st.just("by-hand"), st.integers(0, CARDS - 1), st.integers(1, CARD)),
    st.tuples(st.just("leave"), st.integers(0, 50)),
), max_size=40)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
@example([("loan", 0, 1, 1), ("borrow", 1, 1), ("loan", 0, 2, 0), ("by-hand", 0, 1)])  # shrunk in compute only
def test_owners_and_borrowers_never_exceed_a_card(plan: list[tuple[object, ...]]) -> None:
    state = ClusterState([make_node("n1", CARDS)])
    scheduler = Scheduler(state, make_policy("bestfit"))
    loans: dict[int, Loan] = {}
    shrunk: set[int] = set()  # cards whose loan went below what their borrowers held
    for number, step in enumerate(plan):
        key = f"p/{number}"
        kind = step[0]
        if kind == "owner":
            _, milli, whole = step
            scheduler.schedule(pod_with(key, GpuRequest.whole() if whole else GpuRequest.fraction(int(milli))))
        elif kind in ("loan", "withdraw"):
            card = int(step[1])  # type: ignore[call-overload]
            if kind == "loan":
                loans[card] = Loan(card, OWNER, int(step[2]), int(step[3]))  # type: ignore[call-overload]
            else:
                loans.pop(card, None)
            state.set_loans("n1", loans.values())
        elif kind == "borrow":
            decision = lent_assign(state, pod_with(key, GpuRequest(compute=int(step[2]), memory_mib=int(step[1]))),  # type: ignore[call-overload]
                                   "n1", make_policy("bestfit"))
            if isinstance(decision, Placement):
                state.apply(decision)
        elif kind == "by-hand":
            card, mib = int(step[1]), int(step[2])  # type: ignore[call-overload]
            wanted = dataclasses.replace(raw_placement(key, "n1", [CardSlice(card, mib, 0)]), borrowed_from=OWNER)
            held_mib, held_compute = borrowed_on(state, card)
            # the new borrower holds no compute, but a card whose borrowers already hold more compute
            # than the loan now offers (the loan shrank) takes none at all
            fits = card in loans and held_mib + mib <= loans[card].memory_mib and held_compute <= loans[card].compute
            try:
                state.apply(wanted)
            except AllocationError:
                assert not fits
            else:
                assert fits
        else:
            booked = sorted(state.placements)
            if booked:
                state.release(booked[int(step[1]) % len(booked)])  # type: ignore[call-overload]
        for card in range(CARDS):
            memory, compute = borrowed_on(state, card)
            loan = loans.get(card)
            if memory or compute:
                if loan is None or memory > loan.memory_mib or compute > loan.compute:
                    shrunk.add(card)
            else:
                shrunk.discard(card)
        assert state.over_capacity("n1") == ()
        for card in set(range(CARDS)) - shrunk:
            loan = loans.get(card)
            memory, compute = borrowed_on(state, card)
            assert loan is not None or (memory, compute) == (0, 0)
            if loan is not None:
                assert memory <= loan.memory_mib and compute <= loan.compute


def borrowed_on(state: ClusterState, card: int) -> tuple[int, int]:
    """What the booked borrowers hold on ``card``, recomputed from the placements."""
    held = [p.held_per_card().get(card, (0, 0, False)) for p in state.placements.values()
            if p.borrowed_from is not None]
    return sum(h[0] for h in held), sum(h[1] for h in held)
