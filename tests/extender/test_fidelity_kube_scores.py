"""bench/fidelity_kube.py's stand-in scores: kube-scheduler v1.37's resource plugins on hand-computed cases.

NodeResourcesFit (LeastAllocated) and NodeResourcesBalancedAllocation as in v1.37's
pkg/scheduler/framework/plugins/noderesources (least_allocated.go, balanced_allocation.go,
resource_allocation.go). The balanced cases differ from v1.20's formula, which scored the balance
with the pod alone (case one would have been 100 there).
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from bench.fidelity_kube import (
    KubeSchedulerStandIn,
    balance_score,
    balanced_allocation_score,
    least_allocated_score,
    nonzero_request,
)
from bench.fidelity_scenario import Scenario
from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import ContainerRequest, NodeSpec, PodRequest
from gpupool.testing.fake_api import FakePodApi


@pytest.mark.parametrize(("requested", "allocatable", "expected"), [
    pytest.param((3000, 4096), (4000, 8192), 37, id="mean-of-25-and-50-floored"),
    pytest.param((5000, 1024), (4000, 8192), 43, id="cpu-past-capacity-scores-0"),
    pytest.param((1000, 0), (4000, 0), 75, id="resource-the-node-lacks-left-out"),
    pytest.param((0, 0), (0, 0), 0, id="nothing-allocatable"),
])
def test_least_allocated_is_the_floored_mean_of_the_free_shares(
        requested: tuple[int, int], allocatable: tuple[int, int], expected: int) -> None:
    assert least_allocated_score(requested, allocatable) == expected


@pytest.mark.parametrize(("requested", "allocatable", "expected"), [
    pytest.param((1000, 4000), (4000, 8000), 87, id="fractions-25-50-std-0.125"),
    pytest.param((6000, 0), (4000, 8000), 50, id="fraction-capped-at-1"),
    pytest.param((1000, 0), (4000, 0), 100, id="one-resource-is-balanced"),
])
def test_balance_is_one_minus_half_the_fraction_gap(
        requested: tuple[int, int], allocatable: tuple[int, int], expected: int) -> None:
    assert balance_score(requested, allocatable) == expected


@pytest.mark.parametrize(("allocated", "pod", "expected"), [
    # without: 0.25/0.5 -> 87; with: 0.5/0.5 -> 100; 50 + (50 + 100 - 87) // 2 = 81
    pytest.param((1000, 4000), (1000, 0), 81, id="pod-evens-the-node"),
    # without: 0.5/0.5 -> 100; with: 1.0/0.5 -> 75; 50 + (50 + 75 - 100) // 2 = 62
    pytest.param((2000, 4000), (2000, 0), 62, id="pod-unbalances-an-even-node"),
    # without: 0.75/0 -> 62; with: 1.25 capped to 1/0 -> 50; 50 + (50 + 50 - 62) // 2 = 69
    pytest.param((3000, 0), (2000, 0), 69, id="fraction-capped-at-1"),
    # without and with: 0/0 and 1/0 -> 100 and 50; 50 + (50 + 50 - 100) // 2 = 50 (the lowest)
    pytest.param((0, 0), (4000, 0), 50, id="worst-case-is-50"),
    pytest.param((1000, 4000), (0, 0), 0, id="pod-requesting-nothing-is-skipped"),
])
def test_balanced_allocation_scores_the_pods_change_of_balance(
        allocated: tuple[int, int], pod: tuple[int, int], expected: int) -> None:
    assert balanced_allocation_score(allocated, pod, (4000, 8000)) == expected


def test_score_plugins_count_a_missing_request_as_100m_and_200mib() -> None:
    """LeastAllocated counts the non-zero requests; BalancedAllocation (given ``pod.cpu_milli`` and
    ``pod.memory_mib`` by the stand-in) the actual ones."""
    pod = PodRequest("p", (ContainerRequest("a", cpu_milli=500), ContainerRequest("b", memory_mib=1024)))
    assert nonzero_request(pod) == (600, 1224)
    assert (pod.cpu_milli, pod.memory_mib) == (500, 1024)


def test_stand_in_adds_fit_on_non_zero_requests_to_balance_on_actual_ones() -> None:
    """One node of 4000m and 8000 MiB holding a pod of 1000m and 4000 MiB; the new pod asks 1000m
    and no memory. Fit counts it as 1000m + 200 MiB: (2000 * 100 // 4000 + 3800 * 100 // 8000) // 2
    = (50 + 47) // 2 = 48. BalancedAllocation counts 1000m alone: 81 (the case above). 48 + 81."""
    scenario = Scenario(nodes=(NodeSpec("n1", 4000, 8000),), arrivals=(), profile=WorkloadProfile(()),
                        policy="binpack", seed=0)
    kube = KubeSchedulerStandIn(scenario, cast(Any, None), FakePodApi())
    bound = PodRequest("bound", (ContainerRequest("a", cpu_milli=1000, memory_mib=4000),))
    kube.record_bound_requests(bound, "n1")
    pod = PodRequest("new", (ContainerRequest("a", cpu_milli=1000),))
    assert kube.resource_scores(pod, "n1") == 48 + 81
