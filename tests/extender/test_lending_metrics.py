"""The extender's lending metrics: the loans it knows, the borrowers it placed, and how each filter's
question to lent capacity ended (the earliest-request rule's refusals among them)."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.core.lent import LentTotals
from gpupool.extender.metrics import ExtenderMetrics, LedgerTotals
from gpupool.kube.translate import pod_request
from tests.extender.lending_world import CARD, LENT_MIB, lendable, lending_node, lending_world, waiting
from tests.kube.builders import node

HIGH = 1000


def filtered(service: Any, raw: dict[str, Any]) -> list[str]:
    passed: list[str] = service.filter(pod_request(raw, service.cache.names), ["n1"]).passed
    return passed


def filters(totals: LedgerTotals) -> dict[str, int]:
    return {outcome: count for outcome, count in totals.lending_filters if count}


def scrape(cache: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    metrics = ExtenderMetrics()
    metrics.watch_ledger(cache)
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_loans_borrowers_and_placements_are_counted_until_the_loan_is_withdrawn() -> None:
    borrower = waiting("b", 8000)
    _, cache, service = lending_world(borrower)
    assert LedgerTotals.read(cache).lent == LentTotals(lending_nodes=1, lent_cards=1, lent_memory_mib=LENT_MIB)
    assert filtered(service, borrower) == ["n1"]
    assert service.bind("default", "b", borrower["metadata"]["uid"], "n1").ok
    totals = LedgerTotals.read(cache)
    assert totals.lent == LentTotals(lending_nodes=1, lent_cards=1, borrowers=1, lent_memory_mib=LENT_MIB,
                                     borrowed_memory_mib=8000)
    assert (filters(totals), totals.borrowers_placed) == ({"passed": 1}, 1)
    cache.upsert_node(lending_node(lent=lendable()))  # the owner is back: nothing lent, the borrower still booked
    assert LedgerTotals.read(cache).lent == LentTotals(withdrawn_cards=1, borrowers=1, borrowed_memory_mib=8000)


def test_a_pod_placed_on_free_capacity_is_no_borrower_and_asks_no_loan() -> None:
    raw = waiting("p", 4000)
    _, cache, service = lending_world(raw, nodes=[lending_node("n1", cards=2)])
    assert filtered(service, raw) == ["n1"]
    assert service.bind("default", "p", raw["metadata"]["uid"], "n1").ok
    totals = LedgerTotals.read(cache)
    assert (filters(totals), totals.borrowers_placed, totals.lent.borrowers) == ({}, 0, 0)


def test_each_refused_question_to_lent_capacity_is_counted_by_why() -> None:
    older, younger = waiting("older", 8000, age_s=0), waiting("younger", 8000, age_s=30)
    urgent, large = waiting("urgent", 8000, priority=HIGH), waiting("large", LENT_MIB + 1)
    _, cache, service = lending_world(older, younger, urgent, large,
                                      nodes=[lending_node(lent=lendable()), node("n2", [CARD])])
    cache.upsert_node(lending_node("n2", lendable((0, 4000), uuid_node="n2")))  # too small for either
    assert filtered(service, older) == []  # nothing on n1 lent yet: no loan fits; remembered as waiting
    cache.upsert_node(lending_node())  # card 0 lent: it fits older and younger, not both
    assert filtered(service, younger) == []  # held for the earlier request
    assert filtered(service, urgent) == []
    assert filtered(service, large) == []
    assert filters(LedgerTotals.read(cache)) == {"held_for_earlier": 1, "not_a_borrower": 1, "no_loan_fits": 2}


def test_the_scrape_exports_the_lending_series() -> None:
    borrower = waiting("b", 8000)
    _, cache, service = lending_world(borrower)
    filtered(service, borrower)
    assert service.bind("default", "b", borrower["metadata"]["uid"], "n1").ok
    got = scrape(cache)
    assert got[("gpupool_cluster_lent_cards", (("state", "lent"),))] == 1
    assert got[("gpupool_cluster_lent_cards", (("state", "withdrawn"),))] == 0
    assert got[("gpupool_cluster_lending_nodes", ())] == 1
    assert got[("gpupool_cluster_borrowers_booked", ())] == 1
    assert got[("gpupool_cluster_lent_memory_bytes", ())] == LENT_MIB << 20
    assert got[("gpupool_cluster_borrowed_memory_bytes", ())] == 8000 << 20
    assert got[("gpupool_extender_borrowers_placed_total", ())] == 1
    assert got[("gpupool_extender_lending_filters_total", (("outcome", "passed"),))] == 1
    assert got[("gpupool_extender_lending_filters_total", (("outcome", "held_for_earlier"),))] == 0
