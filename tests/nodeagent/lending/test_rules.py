"""The four priority rules (claims 1, 7) and who the ledger lets share a card."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.api.lending import Priority
from gpupool.nodeagent.lending.rules import (
    RULES,
    Claim,
    ContainerKey,
    Occupant,
    PodKey,
    Rule,
    conflicts,
    decide_open,
    effective,
)
from gpupool.nodeagent.monitor.events import Verdict

H, L = Priority.HIGH, Priority.LOW


def occ(pod: str, priority: Priority = L, claim: Claim = Claim.UNBOOKED, container: str = "c") -> Occupant:
    return Occupant(("ns", pod, container), priority, claim)


@pytest.mark.parametrize(("held", "asked", "rule", "verdict", "reclaimed"), [
    pytest.param(L, H, Rule.RECLAIM_LOW_HOLDER, Verdict.ALLOW, ("holder",), id="1-low-held-high-asks"),
    pytest.param(H, H, Rule.HIGH_WITH_HIGH, Verdict.ALLOW, (), id="2-high-held-high-asks"),
    pytest.param(H, L, Rule.REFUSE_LOW_ASKER, Verdict.DENY, ("asker",), id="3-high-held-low-asks"),
    pytest.param(L, L, Rule.LOW_WITH_LOW, Verdict.ALLOW, (), id="4-low-held-low-asks"),
])
def test_the_four_rules_by_pod_priority(held: Priority, asked: Priority, rule: Rule, verdict: Verdict,
                                        reclaimed: tuple[str, ...]) -> None:
    decision = decide_open(occ("asker", asked), [occ("holder", held)])
    assert (decision.rule, decision.verdict) == (rule, verdict)
    assert decision.reclaim == tuple(("ns", p) for p in reclaimed)
    assert decision.recorded is asked


def test_a_free_card_is_allowed_and_recorded_at_the_askers_priority() -> None:
    decision = decide_open(occ("a", H), [])
    assert (decision.verdict, decision.rule, decision.recorded) == (Verdict.ALLOW, Rule.NO_CONFLICT, H)


@pytest.mark.parametrize(("asker", "holder", "dormant", "rule", "verdict", "reclaim"), [
    pytest.param(occ("owner", L, Claim.BOOKED), occ("b", H, Claim.BORROWED), frozenset(),
                 Rule.RECLAIM_LOW_HOLDER, Verdict.ALLOW, (("ns", "b"),), id="owner-returns-borrower-reclaimed"),
    pytest.param(occ("b", H, Claim.BORROWED), occ("owner", H, Claim.BOOKED), frozenset({("ns", "owner", "c")}),
                 Rule.NO_CONFLICT, Verdict.ALLOW, (), id="borrower-opens-card-of-dormant-owner"),
    pytest.param(occ("b", L, Claim.BORROWED), occ("owner", L, Claim.BOOKED), frozenset(),
                 Rule.REFUSE_LOW_ASKER, Verdict.DENY, (("ns", "b"),), id="borrower-after-the-owner-returned"),
    pytest.param(occ("x", L, Claim.BOOKED), occ("y", H, Claim.BOOKED), frozenset(),
                 Rule.NO_CONFLICT, Verdict.ALLOW, (), id="two-bookings-share-by-the-ledger"),
    pytest.param(occ("b1", L, Claim.BORROWED), occ("b2", L, Claim.BORROWED), frozenset(),
                 Rule.NO_CONFLICT, Verdict.ALLOW, (), id="two-borrowers-share-lent-capacity"),
    pytest.param(occ("x", H, Claim.BOOKED), occ("u", L, Claim.UNBOOKED), frozenset(),
                 Rule.RECLAIM_LOW_HOLDER, Verdict.ALLOW, (("ns", "u"),), id="high-booking-vs-unbooked-low"),
    pytest.param(occ("x", L, Claim.BOOKED), occ("u", H, Claim.UNBOOKED), frozenset(),
                 Rule.REFUSE_LOW_ASKER, Verdict.DENY, (("ns", "x"),), id="low-booking-vs-unbooked-high"),
    pytest.param(occ("a", H, container="one"), occ("a", L, container="two"), frozenset(),
                 Rule.RECLAIM_LOW_HOLDER, Verdict.ALLOW, (("ns", "a"),), id="containers-of-one-pod-unbooked"),
])
def test_who_conflicts(asker: Occupant, holder: Occupant, dormant: frozenset[ContainerKey], rule: Rule,
                       verdict: Verdict, reclaim: tuple[PodKey, ...]) -> None:
    decision = decide_open(asker, [holder], dormant=dormant)
    assert (decision.rule, decision.verdict, decision.reclaim) == (rule, verdict, reclaim)


def test_a_borrower_is_low_whatever_its_pod_priority() -> None:
    decision = decide_open(occ("b", H, Claim.BORROWED), [])
    assert decision.recorded is L


def test_a_pod_in_reclaim_is_refused_and_never_reclaimed_twice() -> None:
    reclaiming = frozenset({("ns", "b")})
    refused = decide_open(occ("b", L, Claim.BORROWED), [occ("owner", H, Claim.BOOKED)], reclaiming=reclaiming)
    assert (refused.verdict, refused.rule, refused.reclaim) == (Verdict.DENY, Rule.RECLAIM_IN_FLIGHT, ())
    owner_again = decide_open(occ("owner", H, Claim.BOOKED), [occ("b", L, Claim.BORROWED)], reclaiming=reclaiming)
    assert (owner_again.verdict, owner_again.reclaim) == (Verdict.ALLOW, ())


def test_a_refusal_wins_and_reclaims_only_the_asker() -> None:
    decision = decide_open(occ("x", H, Claim.BOOKED), [occ("b", L, Claim.BORROWED), occ("u", H, Claim.UNBOOKED),
                                                       occ("v", H, Claim.UNBOOKED)])
    assert (decision.verdict, decision.rule, decision.reclaim) == (Verdict.ALLOW, Rule.RECLAIM_LOW_HOLDER,
                                                                   (("ns", "b"),))
    low = decide_open(occ("x", L, Claim.UNBOOKED), [occ("b", L, Claim.BORROWED), occ("u", H, Claim.UNBOOKED)])
    assert (low.verdict, low.reclaim) == (Verdict.DENY, (("ns", "x"),))


# ---------------------------------------------------------------- property: no forbidden sharing

OCCUPANTS = [occ(f"p{i}", p, c) for i, (p, c) in enumerate(
    [(H, Claim.BOOKED), (L, Claim.BOOKED), (H, Claim.BORROWED), (L, Claim.BORROWED), (H, Claim.UNBOOKED),
     (L, Claim.UNBOOKED)])]
STEP = st.one_of(st.tuples(st.just("open"), st.integers(0, len(OCCUPANTS) - 1)),
                 st.tuples(st.just("close"), st.integers(0, len(OCCUPANTS) - 1)),
                 st.tuples(st.just("reclaimed"), st.integers(0, len(OCCUPANTS) - 1)),
                 st.tuples(st.just("lend"), st.just(0)))


def _allowed_together(a: Occupant, b: Occupant, dormant: frozenset[ContainerKey]) -> bool:
    if not (conflicts(a, b, dormant) and conflicts(b, a, dormant)):
        return True
    return effective(a, b) is effective(b, a)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.lists(STEP, max_size=40))
def test_no_card_is_held_by_two_containers_the_ledger_does_not_allow(steps: list[tuple[str, int]]) -> None:
    """Applying the decisions as the agent does (allow → holder, reclaim → in flight until done, an
    owner's open ends its loan), every pair of holders not being reclaimed may share the card."""
    holders: dict[ContainerKey, Occupant] = {}
    dormant: frozenset[ContainerKey] = frozenset()
    reclaiming: set[PodKey] = set()
    for action, i in steps:
        who = OCCUPANTS[i]
        if action == "open":
            decision = decide_open(who, holders.values(), dormant=dormant, reclaiming=frozenset(reclaiming))
            reclaiming.update(decision.reclaim)
            if decision.verdict is Verdict.ALLOW:
                holders[who.container] = who
                dormant = dormant - {who.container}
        elif action == "close":
            holders.pop(who.container, None)
        elif action == "reclaimed" and who.pod in reclaiming:
            reclaiming.discard(who.pod)
            holders = {k: v for k, v in holders.items() if v.pod != who.pod}
        elif action == "lend" and not any(h.claim is Claim.BORROWED for h in holders.values()):
            dormant = frozenset(k for k, h in holders.items() if h.claim is Claim.BOOKED)
        live = [h for h in holders.values() if h.pod not in reclaiming]
        for a in live:
            for b in live:
                assert _allowed_together(a, b, dormant), (a, b, dormant, steps)


def test_the_table_has_the_four_rules() -> None:
    assert {o.rule for o in RULES.values()} == {Rule.RECLAIM_LOW_HOLDER, Rule.HIGH_WITH_HIGH,
                                                Rule.REFUSE_LOW_ASKER, Rule.LOW_WITH_LOW}
