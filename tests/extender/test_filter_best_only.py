"""``--filter-best-only``: filter passes exactly the nodes prioritize would score 10, and says why
every other node was left out.

With the scheduler configuration without ``prioritizeVerb`` kube-scheduler chooses among the nodes
filter passes, so the passed set must be the policy's best set (ties included) for the placement to
stay the policy's; the refused nodes keep a reason each, the nodes that fit but are not best a
"fits, but ..." one. On the wire (``FailedNodes``) the reasons go only with an answer that passes no
node: kube-scheduler reads them then only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.extender.cache import ClusterCache
from gpupool.extender.node_ranking import NOT_BEST, best_nodes
from gpupool.extender.service import MAX_EXTENDER_PRIORITY, ExtenderService, ExtenderSettings, scale_scores
from gpupool.kube.translate import pod_request
from tests.extender.http_world import ALIBABA_NODES, ALIBABA_PODS, post_filter
from tests.extender.modes import ALL_BEST, EVERY_FIT
from tests.kube.builders import container, node, placed_pod, pod

BEST_ONLY = ALL_BEST
"""Every best node (``--filter-all-best``): the shipped one-best mode passes one of them, tested in
tests/extender/test_filter_one_best.py."""


@pytest.mark.parametrize(("raw", "kept", "reasons"), [
    pytest.param([0.0, 99.0, 100.0], ["n2"], {"n0": 0, "n1": 9}, id="near-best-is-left-out"),
    pytest.param([5.0, 7.0, 7.0, 6.0], ["n1", "n2"], {"n0": 0, "n3": 5}, id="ties-all-kept-in-order"),
    pytest.param([3.0, 3.0], ["n0", "n1"], {}, id="all-equal-all-pass"),
    pytest.param([], [], {}, id="nothing-fits"),
])
def test_best_nodes_keeps_the_top_scored_and_explains_the_rest(raw: list[float], kept: list[str],
                                                               reasons: dict[str, int]) -> None:
    names = [f"n{i}" for i in range(len(raw))]
    rows = np.arange(len(raw), dtype=np.int64)
    best = best_nodes(names, rows, np.array(raw))
    assert best.passed == kept
    assert best.rows.tolist() == [names.index(n) for n in kept]
    assert best.not_best == {name: NOT_BEST.format(score=step) for name, step in reasons.items()}


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=40))
def test_the_passed_nodes_are_exactly_those_prioritize_scores_ten(raw: list[float]) -> None:
    names = [f"n{i}" for i in range(len(raw))]
    scores = np.array(raw)
    best = best_nodes(names, np.arange(len(raw), dtype=np.int64), scores)
    scaled = scale_scores(names, scores, names).as_dict()
    assert best.passed == [n for n in names if scaled[n] == MAX_EXTENDER_PRIORITY]
    assert best.not_best == {n: NOT_BEST.format(score=scaled[n]) for n in names if scaled[n] < MAX_EXTENDER_PRIORITY}


def alibaba_cache() -> ClusterCache:
    """Three nodes of two 16,276 MiB cards: N1 has 4,069 MiB free on one card, N2 on each, N3 8,138 on
    one; binpack ties N1 and N2 for a 4,069 MiB pod (it fills a card on either)."""
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes(ALIBABA_NODES)
    cache.replace_pods(ALIBABA_PODS)
    return cache


@pytest.mark.parametrize(("mib", "passed", "not_best", "refused"), [
    pytest.param(4069, ["N1", "N2"], {"N3"}, set(), id="binpack-ties-the-cards-the-pod-fills"),
    pytest.param(8138, ["N3"], set(), {"N1", "N2"}, id="one-node-fits"),
    pytest.param(16276, [], set(), {"N1", "N2", "N3"}, id="none-fits"),
])
def test_filter_passes_the_best_nodes_and_gives_every_other_node_a_reason(
        mib: int, passed: list[str], not_best: set[str], refused: set[str]) -> None:
    cache = alibaba_cache()
    request = pod_request(pod("p", container(mib=mib)), cache.names)
    outcome = ExtenderService(cache, None, settings=BEST_ONLY).filter(request, ["N1", "N2", "N3"])
    assert outcome.error == "" and outcome.passed == passed
    assert set(outcome.failed) == not_best | refused
    assert {n for n, why in outcome.failed.items() if why.startswith("fits, but")} == not_best
    everything = ExtenderService(cache, None, settings=EVERY_FIT).filter(request, ["N1", "N2", "N3"])
    assert set(everything.passed) == set(passed) | not_best
    assert {n: everything.failed[n] for n in refused} == {n: outcome.failed[n] for n in refused}


def test_the_best_set_is_prioritizes_ten_on_a_busier_cluster() -> None:
    """Many nodes, many shapes: filter (best only) and prioritize (after a filter that passes every
    node that fits) agree."""
    cache = ClusterCache(policy="binpack")
    names = [f"node-{i}" for i in range(12)]
    cache.replace_nodes([node(n, [16384] * 4) for n in names])
    cache.replace_pods([placed_pod(f"p{i}", names[i % 12], i % 4, 1024 * (1 + i % 7)) for i in range(30)])
    best_only = ExtenderService(cache, None, settings=BEST_ONLY)
    default = ExtenderService(cache, None, settings=EVERY_FIT)
    narrowed = 0
    for limits in ({"gpu_mem": 8}, {"gpu_mem": 40}, {"gpu": 1}, {"gpu": 2}, {"gpu_core": 30, "gpu_mem": 16}):
        request = pod_request(pod("p", container(**limits)), cache.names)
        feasible = default.filter(request, names).passed
        scores, error = default.prioritize(request, feasible)
        assert error == ""
        ten = [n for n, s in scores.as_dict().items() if s == MAX_EXTENDER_PRIORITY]
        assert best_only.filter(request, names).passed == ten, limits
        narrowed += len(ten) < len(feasible)
    assert narrowed  # the case is not vacuous: some shape has feasible nodes that are not best


def test_prioritize_after_a_best_only_filter_scores_every_passed_node_ten() -> None:
    """A scheduler configuration that keeps prioritizeVerb still gets the policy's choice."""
    cache = alibaba_cache()
    request = pod_request(pod("p", container(mib=4069)), cache.names)
    service = ExtenderService(cache, None, settings=BEST_ONLY)
    passed = service.filter(request, ["N1", "N2", "N3"]).passed
    scores, error = service.prioritize(request, passed)
    assert error == "" and scores.as_dict() == dict.fromkeys(passed, MAX_EXTENDER_PRIORITY)


def http_filter(settings: ExtenderSettings, mib: int) -> dict[str, Any]:
    """The filter answer kube-scheduler decodes for a pod of ``mib`` asked about N3, N2, N1."""
    body = {"Pod": pod("p", container(mib=mib)), "Nodes": None, "NodeNames": ["N3", "N2", "N1"]}
    return post_filter(ExtenderService(alibaba_cache(), None, settings=settings), body)


def test_the_http_filter_answers_the_best_nodes_without_reasons_for_the_rest() -> None:
    """NodeNames the best nodes; no FailedNodes, which kube-scheduler reads only when none passed."""
    doc = http_filter(BEST_ONLY, 4069)
    assert doc["NodeNames"] == ["N2", "N1"] and doc["Error"] == ""  # both fill a card: tied best, order kept
    assert doc["FailedNodes"] == {}


def test_the_http_filter_gives_every_node_a_reason_when_none_passes() -> None:
    """What the pod's FitError event and preemption read: a reason for each node asked about."""
    doc = http_filter(BEST_ONLY, 16276)
    assert doc["NodeNames"] == [] and doc["Error"] == ""
    assert set(doc["FailedNodes"]) == {"N1", "N2", "N3"}
    assert all("16276 MiB" in why for why in doc["FailedNodes"].values()), doc["FailedNodes"]


def test_without_best_only_the_http_filter_still_gives_the_reasons_beside_passed_nodes() -> None:
    doc = http_filter(EVERY_FIT, 8138)
    assert doc["NodeNames"] == ["N3"] and set(doc["FailedNodes"]) == {"N2", "N1"}


@pytest.mark.parametrize(("mib", "passed", "failed"), [
    pytest.param(4069, ["N1", "N2"], set(), id="not-best-left-unexplained"),
    pytest.param(8138, ["N3"], set(), id="refused-left-unexplained"),
    pytest.param(16276, [], {"N1", "N2", "N3"}, id="none-passed-every-node-explained"),
])
def test_a_filter_without_reasons_beside_passed_nodes_explains_only_when_none_passed(
        mib: int, passed: list[str], failed: set[str]) -> None:
    """What the HTTP answer of best only asks for: it drops the reasons whenever a node passed, so
    they are not worked out then; the passed nodes are the same either way."""
    cache = alibaba_cache()
    request = pod_request(pod("p", container(mib=mib)), cache.names)
    service = ExtenderService(cache, None, settings=BEST_ONLY)
    outcome = service.filter(request, ["N1", "N2", "N3"], reasons_if_passed=False)
    assert outcome.passed == passed and set(outcome.failed) == failed
    assert outcome.failed == {n: why for n, why in service.filter(request, ["N1", "N2", "N3"]).failed.items()
                              if n in failed}


def test_best_nodes_without_reasons_keeps_the_same_nodes() -> None:
    names, rows, scores = ["a", "b", "c"], np.array([0, 1, 2]), np.array([1.0, 3.0, 3.0])
    with_reasons, without = best_nodes(names, rows, scores), best_nodes(names, rows, scores, reasons=False)
    assert without.passed == with_reasons.passed == ["b", "c"]
    assert without.rows.tolist() == [1, 2] and without.not_best == {} and with_reasons.not_best
