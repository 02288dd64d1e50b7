"""The scheduler's shape caches: feasibility per request, scores shared by pods that differ in memory only."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import PodRequest
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.shape_cache import RowCaches
from gpupool.core.state import ClusterState
from tests.core.builders import CountingPolicy, cpu_pod, make_node, slice_pod


def cluster() -> ClusterState:
    return ClusterState([make_node(f"n{i}", 4, cpu=16_000 + 4_000 * i, memory=64_000 * (i + 1)) for i in range(6)])


def workload() -> list[PodRequest]:
    """Slices, whole cards and CPU-only pods, several sharing CPU and GPU but not memory."""
    pods: list[PodRequest] = []
    for i in range(60):
        milli = (250, 500, 1000, 300)[i % 4]
        pods.append(slice_pod(f"p{i}", milli, cpu=1_000 + 500 * (i % 3), memory=1_024 * (1 + i % 5)))
        if i % 7 == 0:
            pods.append(cpu_pod(f"c{i}", cpu=2_000, memory=4_096 * (1 + i % 2)))
    return pods


def scheduler(state: ClusterState, *, cache: bool, pods: list[PodRequest]) -> Scheduler:
    profile = WorkloadProfile.from_pods(pods)
    return Scheduler(state, make_policy("gpupool", np.random.default_rng(1)), profile=profile,
                     tie_rank=np.arange(state.size, dtype=np.int64), cache=cache)


def test_cached_decisions_are_the_uncached_ones() -> None:
    pods = workload()
    cached, uncached = cluster(), cluster()
    fast = scheduler(cached, cache=True, pods=pods)
    slow = scheduler(uncached, cache=False, pods=pods)
    for pod in pods:
        assert fast.schedule(pod) == slow.schedule(pod)


def test_pods_differing_only_in_memory_share_the_scores() -> None:
    state = cluster()
    policy = CountingPolicy(make_policy("gpupool"))
    sched = Scheduler(state, policy, profile=WorkloadProfile.from_pods(workload()))
    sched.filter_and_score(slice_pod("a", 300, cpu=2_000, memory=1_024))
    assert policy.rows_scored == state.size
    rows, _ = sched.filter_and_score(slice_pod("b", 300, cpu=2_000, memory=200_000))
    assert policy.rows_scored == state.size  # only feasibility was computed for the new memory
    assert len(rows) == 3  # n3..n5 have the memory
    sched.filter_and_score(slice_pod("c", 300, cpu=3_000, memory=1_024))
    assert policy.rows_scored == 2 * state.size  # another CPU is another score


def test_scores_are_recomputed_when_their_entry_was_dropped() -> None:
    """A feasibility entry outliving its score entry must not offer rows without a score."""
    state = cluster()
    sched = scheduler(state, cache=True, pods=workload())
    sched._scores = RowCaches(-np.inf, np.float64, kept=1)
    first = slice_pod("a", 300, cpu=2_000)
    expected = sched.filter_and_score(first)
    sched.filter_and_score(slice_pod("b", 300, cpu=3_000))  # drops the scores of cpu=2000
    rows, scores = sched.filter_and_score(first)
    np.testing.assert_array_equal(rows, expected[0])
    np.testing.assert_array_equal(scores, expected[1])
    assert np.isfinite(scores).all()


def test_row_caches_drop_the_oldest_and_renew_on_growth() -> None:
    caches: RowCaches[np.bool_] = RowCaches(False, np.bool_, kept=2)
    first = caches.entry("a", 3)
    first.version[:] = 7
    assert caches.entry("a", 3) is first
    caches.entry("b", 3)
    caches.entry("c", 3)  # "a" is the oldest
    assert len(caches) == 2
    again = caches.entry("a", 3)
    assert again is not first and (again.version == -1).all()
    grown = caches.entry("a", 4)
    assert grown is not again and len(grown.version) == 4
    assert grown.generation > again.generation


@pytest.mark.parametrize("versions, stale", [
    pytest.param([3, 3, 3], [], id="all-current"),
    pytest.param([3, 4, 3], [1], id="one-changed"),
    pytest.param([4, 4, 4], [0, 1, 2], id="all-changed"),
])
def test_stale_rows_are_those_computed_at_another_version(versions: list[int], stale: list[int]) -> None:
    entry = RowCaches(0.0, np.float64).entry("k", 3)
    entry.version[:] = 3
    assert entry.stale(np.array(versions, dtype=np.int64)).tolist() == stale
