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


def _measure(policy: str, nodes: int = 40, seed: int = 42, upto: int = 90) -> dict[str, Any]:
    scenario = build_scenario("default", nodes, seed, upto, policy)
    result: dict[str, Any] = compare(scenario, replay_simulator(scenario), replay_extender(scenario))
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


def test_trace_pods_translate_back_to_the_same_request() -> None:
    """The Kubernetes pod the bench creates is read by the extender as the trace's request."""
    scenario = build_scenario("default", 40, 42, 90, "binpack")
    for pod in scenario.arrivals:
        translated = pod_request(pod_object(pod), ResourceNames())
        assert translated.containers == pod.containers, pod.key
