"""bench/fidelity.py on a small sample: the cluster's decisions are the simulator's.

The bench replays one seed's packing arrivals through the extender's HTTP verbs (with a stand-in
for kube-scheduler) and through the simulator; these tests hold the agreement it measures.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.fidelity import build_scenario, compare, pod_object, replay_extender, replay_simulator
from gpupool.api.names import ResourceNames
from gpupool.kube.translate import pod_request

# Slow, so scripts/test-all runs it and a plain pytest does not: each case replays a trace through the extender and
# the simulator.
pytestmark = pytest.mark.slow


def _measure(policy: str, nodes: int = 40, seed: int = 42, upto: int = 90, *, best_only: bool = False,
             extender_weight: int | None = None, one_best: bool = False) -> dict[str, Any]:
    scenario = build_scenario("default", nodes, seed, upto, policy)
    extender = replay_extender(scenario, extender_weight, best_only, one_best)
    result: dict[str, Any] = compare(scenario, replay_simulator(scenario), extender)
    return result


@pytest.mark.parametrize("policy", [
    pytest.param("binpack", id="binpack"),
    pytest.param("packing", id="packing"),
])
def test_gpu_only_policies_place_every_pod_as_the_simulator(policy: str) -> None:
    """Policies that score GPUs only do not need the extender to see the pods' CPU."""
    result = _measure(policy)
    assert result["pods"] > 100 and result["bind_refusals"] == 0
    assert result["same_placement_pct"] == 100.0, result["first_divergence"]
    assert result["unallocated_pct_extender"] == result["unallocated_pct_simulator"]


def test_default_policy_places_every_pod_as_the_simulator() -> None:
    result = _measure("gpupool")
    assert result["ledger_mismatch_nodes"] == 0
    assert result["same_placement_pct"] >= 99.0, result["first_divergence"]


@pytest.mark.parametrize("policy", [pytest.param("binpack", id="binpack"), pytest.param("gpupool", id="gpupool")])
def test_filter_best_only_without_prioritize_places_every_pod_as_the_simulator(policy: str) -> None:
    """--filter-best-only and no prioritizeVerb: kube-scheduler chooses among the nodes filter passed,
    which are exactly the policy's best, so the placement is the simulator's."""
    result = _measure(policy, best_only=True)
    assert result["pods"] > 100 and result["bind_refusals"] == 0 and result["ledger_mismatch_nodes"] == 0
    assert result["same_placement_pct"] == 100.0, result["first_divergence"]
    assert result["unallocated_pct_extender"] == result["unallocated_pct_simulator"]


def test_filter_best_only_leaves_kube_schedulers_plugins_the_same_choice_as_the_shipped_weight() -> None:
    """With kube-scheduler's resource plugins scoring, both modes choose the same nodes: the weight
    makes the plugins choose among the extender's best nodes, and best-only passes only those."""
    scenario = build_scenario("default", 40, 42, 90, "gpupool")
    weighted = replay_extender(scenario, 100)
    best_only = replay_extender(scenario, 100, best_only=True)
    assert weighted.outcomes == best_only.outcomes
    assert best_only.outcomes != replay_extender(scenario).outcomes  # the plugins did break ties here


@pytest.mark.parametrize("extender_weight", [
    pytest.param(None, id="extender-alone"),
    pytest.param(1, id="with-resource-plugins"),
])
def test_filter_one_best_places_every_pod_as_the_simulator_whatever_kube_schedulers_plugins(
        extender_weight: int | None) -> None:
    """--filter-one-best in the simulator's tie order: one node passes, so kube-scheduler's resource
    plugins, which draw among all the best nodes otherwise, have nothing to choose."""
    result = _measure("gpupool", best_only=True, one_best=True, extender_weight=extender_weight)
    assert result["pods"] > 100 and result["bind_refusals"] == 0 and result["ledger_mismatch_nodes"] == 0
    assert result["same_placement_pct"] == 100.0, result["first_divergence"]
    assert result["unallocated_pct_extender"] == result["unallocated_pct_simulator"]
    if extender_weight is not None:  # not vacuous: passed every best node, the plugins choose otherwise
        assert _measure("gpupool", best_only=True, extender_weight=extender_weight)["same_placement_pct"] < 100.0


def test_trace_pods_translate_back_to_the_same_request() -> None:
    """The Kubernetes pod the bench creates is read by the extender as the trace's request."""
    scenario = build_scenario("default", 40, 42, 90, "binpack")
    for pod in scenario.arrivals:
        translated = pod_request(pod_object(pod), ResourceNames())
        assert translated.containers == pod.containers, pod.key
