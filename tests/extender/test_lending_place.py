"""The extender places borrowers on lent capacity by itself: filter, bind, the marks it writes."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.lending import is_borrowed
from gpupool.core.lent import LentState
from gpupool.extender.bookings import Stage
from gpupool.kube.translate import pod_request
from tests.extender.lending_world import (
    CARD,
    LENT_MIB,
    NAMES,
    OWNER,
    lendable,
    lending_node,
    lending_world,
    waiting,
)
from tests.kube.builders import node

HIGH = 1000


def filtered(service: Any, raw: dict[str, Any], nodes: list[str] | None = None) -> Any:
    return service.filter(pod_request(raw, service.cache.names), nodes or ["n1"])


def test_a_low_priority_pod_that_fits_no_free_capacity_is_bound_onto_the_lent_card() -> None:
    borrower = waiting("b", 8000)
    api, cache, service = lending_world(borrower)
    outcome = filtered(service, borrower)
    assert outcome.passed == ["n1"], outcome.failed
    result = service.bind("default", "b", borrower["metadata"]["uid"], "n1")
    assert result.ok, result.error
    assert result.placement is not None and result.placement.borrowed_from == OWNER
    annotations = api.get_pod("default", "b")["metadata"]["annotations"]
    assert is_borrowed(annotations) and annotations[NAMES.borrowed_from] == OWNER
    assert cache.state.lent.free(0, 0) == (LENT_MIB - 8000, 1000)
    assert cache.state.placements["default/b"].borrowed_from == OWNER  # the watch's copy, as bound
    assert cache.overcommitted_cards() == 0


@pytest.mark.parametrize(("raw", "why"), [
    pytest.param(waiting("b", 8000, priority=HIGH), "a high-priority pod does not borrow", id="high-priority"),
    pytest.param(waiting("b", 8000, borrow="false"), "gpupool.io/borrow: 'false'", id="opted-out"),
    pytest.param(waiting("b", 8000, controlled=False), "without a controller", id="bare-pod"),
    pytest.param(waiting("b", 8000, borrow="yes"), "gpupool.io/borrow: 'yes'", id="unknown-value"),
    pytest.param(waiting("b", LENT_MIB + 1), "lent capacity: no single card", id="larger-than-the-loan"),
])
def test_pods_that_may_not_borrow_or_do_not_fit_are_refused_with_a_reason(raw: dict[str, Any], why: str) -> None:
    _, _, service = lending_world(raw)
    outcome = filtered(service, raw)
    assert outcome.passed == []
    assert why in outcome.failed["n1"]
    assert service.bind("default", "b", raw["metadata"]["uid"], "n1").error


@pytest.mark.parametrize(("raw", "passed"), [
    pytest.param(waiting("b", 8000), ["n1"], id="a-borrower"),
    pytest.param(waiting("b", 8000, priority=HIGH), [], id="a-high-priority-pod"),
])
def test_a_pod_the_watch_has_not_delivered_yet_is_judged_by_the_object_the_filter_was_sent(
        raw: dict[str, Any], passed: list[str]) -> None:
    """kube-scheduler can ask about a pod before the extender's watch has it; refusing then costs
    the pod a retry with back-off (1-10 s)."""
    _, _, service = lending_world()  # the API and the cache know only the owner
    request = pod_request(raw, service.cache.names)
    assert "has not seen the pod yet" in service.filter(request, ["n1"]).failed["n1"]
    assert service.filter(request, ["n1"], pod=raw).passed == passed


def test_a_bare_pod_borrows_when_it_opts_in() -> None:
    raw = waiting("b", 8000, controlled=False, borrow="true")
    _, _, service = lending_world(raw)
    assert filtered(service, raw).passed == ["n1"]


def test_free_capacity_is_preferred_to_lent_capacity() -> None:
    borrower = waiting("b", 8000)
    _, _, service = lending_world(borrower, nodes=[lending_node(), node("n2", [CARD])])
    outcome = filtered(service, borrower, ["n1", "n2"])
    assert outcome.passed == ["n2"]
    result = service.bind("default", "b", borrower["metadata"]["uid"], "n2")
    assert result.ok and result.placement is not None and result.placement.borrowed_from is None


def test_a_normal_pod_on_a_lending_node_never_gets_lent_capacity_even_when_bound_there() -> None:
    raw = waiting("p", 8000, priority=HIGH)
    _, cache, service = lending_world(raw)
    result = service.bind("default", "p", raw["metadata"]["uid"], "n1")
    assert "a high-priority pod does not borrow" in result.error
    assert cache.state.lent.borrowed(0, 0) == (0, 0)


def test_the_earliest_request_wins_the_loan() -> None:
    """Both fit the loan, not together: the older waiting pod is asked about first by its own
    filter (refused owned capacity), then the younger one is refused the node while the older
    one waits, and gets it once the older one is bound."""
    older, younger = waiting("older", 8000, age_s=0), waiting("younger", 8000, age_s=30)
    _, _, service = lending_world(older, younger, nodes=[lending_node(lent=lendable()), node("n2", [CARD])])
    service.cache.upsert_node(lending_node("n2", lendable((0, 4000), uuid_node="n2")))  # too small for both
    assert filtered(service, older).passed == []  # no loan on n1 yet: the older pod waits
    service.cache.upsert_node(lending_node())  # the owner idles: card 0 is lent
    outcome = filtered(service, younger)
    assert outcome.passed == []
    assert "held for the earlier request default/older" in outcome.failed["n1"]
    refused = service.bind("default", "younger", younger["metadata"]["uid"], "n1")
    assert "held for the earlier request default/older" in refused.error
    assert filtered(service, older).passed == ["n1"]
    assert service.bind("default", "older", older["metadata"]["uid"], "n1").ok
    assert "no single card" in filtered(service, younger).failed["n1"]  # the loan is taken now


def test_a_younger_pod_may_take_what_the_older_one_cannot_use() -> None:
    older, younger = waiting("older", LENT_MIB + 1000, age_s=0), waiting("younger", 4000, age_s=30)
    _, _, service = lending_world(older, younger)
    assert filtered(service, older).passed == []
    assert filtered(service, younger).passed == ["n1"]


def test_a_withdrawn_loan_keeps_its_borrowers_and_places_no_new_one() -> None:
    first, second = waiting("first", 4000), waiting("second", 4000, age_s=10)
    _, cache, service = lending_world(first, second)
    assert service.bind("default", "first", first["metadata"]["uid"], "n1").ok
    withdrawn = lending_node(lent=lendable())
    cache.upsert_node(withdrawn)
    assert cache.state.lent.state(0, 0) is LentState.WITHDRAWN
    assert cache.state.placements["default/first"].borrowed_from == OWNER
    assert filtered(service, second).passed == []
    assert service.bind("default", "second", second["metadata"]["uid"], "n1").error


@pytest.mark.parametrize(("text", "why"), [
    pytest.param("{not json", "not JSON", id="not-json"),
    pytest.param(lendable((0, 1000), uuid_node="elsewhere"), "not in the node's inventory", id="unknown-card"),
])
def test_a_broken_lendable_annotation_lends_nothing_with_a_reason(text: str, why: str) -> None:
    borrower = waiting("b", 8000)
    _, cache, service = lending_world(borrower, nodes=[lending_node(lent=text)])
    assert why in cache.loans.problems["n1"]
    assert cache.state.lent.lending_rows() == []
    assert filtered(service, borrower).passed == []


def test_an_older_pod_holds_only_the_loans_of_nodes_its_own_filter_admitted() -> None:
    """The older pod can never run on n1 (kube-scheduler proposed only n2 for it: a selector, a
    taint): it holds nothing there, and the younger pod borrows n1's card."""
    older, younger = waiting("older", 8000, age_s=0), waiting("younger", 8000, age_s=30)
    _, _, service = lending_world(older, younger, nodes=[lending_node(), node("n2", [])])
    assert filtered(service, older, ["n2"]).passed == []
    assert filtered(service, younger, ["n1"]).passed == ["n1"]


def test_a_finished_older_pod_holds_nothing() -> None:
    older, younger = waiting("older", 8000, age_s=0), waiting("younger", 8000, age_s=30)
    _, cache, service = lending_world(older, younger)
    assert filtered(service, older).passed == ["n1"]  # it was asked first, and not bound yet
    assert cache.bookings["default/older"].stage is Stage.ASSUMED  # its filter's choice holds the loan
    assert filtered(service, younger).passed == []
    older["status"]["phase"] = "Failed"
    older["metadata"]["resourceVersion"] = "2"
    cache.upsert_pod(older)
    assert filtered(service, younger).passed == ["n1"]


def test_waiting_pods_are_forgotten_once_they_no_longer_wait() -> None:
    borrower = waiting("b", LENT_MIB + 1)
    api, cache, service = lending_world(borrower, waiting("other", 1000, age_s=5))
    assert filtered(service, borrower).passed == []
    assert "default/b" in cache.lending.waiting
    api.delete_pod("default", "b")
    filtered(service, waiting("other", 1000, age_s=5))
    assert "default/b" not in cache.lending.waiting
