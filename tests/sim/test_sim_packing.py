"""The packing simulator: arrival order, 130 % inflation, the recorder's binning, whole replays."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from gpupool.core.fragmentation import FragmentationMeasure, WorkloadProfile
from gpupool.core.model import ContainerRequest, GpuCard, GpuRequest, NodeSpec, Placement, PodRequest
from gpupool.core.policies import POLICIES, make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from gpupool.sim import fragment_log
from gpupool.sim.packing import INFLATION, REPORT_POINTS, SeedResult, _Recorder, run_seed, workload


def gpu_nodes(count: int, cards: int, model: str = "A") -> list[NodeSpec]:
    return [NodeSpec(name=f"node-{i}", cpu_milli=64_000, memory_mib=256_000,
                     cards=tuple(GpuCard(index=g, uuid=f"GPU-{i}-{g}", model=model, memory_mib=16_384)
                                 for g in range(cards)))
            for i in range(count)]


def pod(key: str, milli: int, count: int = 1, models: frozenset[str] = frozenset(), cpu: int = 1_000) -> PodRequest:
    gpu = GpuRequest.fraction(milli, count, models) if milli else None
    return PodRequest(key=key, containers=(ContainerRequest("main", cpu_milli=cpu, memory_mib=1_024, gpu=gpu),))


# ------------------------------------------------------------------------------------ recorder


@pytest.mark.parametrize(
    ("arrived", "capacity", "bin_"),
    [
        (455, 1000, 46),    # 45.5 -> 46 (half to even)
        (445, 1000, 44),    # 44.5 -> 44 (half to even, as Python's round in the paper's scripts)
        (125, 1000, 12),
        (1_300, 1000, 130),
        (0, 1000, 0),
        (4_000, 4000, 100),
        (4_499, 4000, 112),
    ],
)
def test_recorder_bins_arrivals_by_rounded_percent(arrived: int, capacity: int, bin_: int) -> None:
    assert _Recorder(capacity).add(arrived, 0) == bin_


def test_recorder_curve_averages_rows_of_a_bin() -> None:
    recorder = _Recorder(1_000)
    recorder.add(100, 400)   # bin 10, 40 % allocated
    recorder.add(101, 500)   # bin 10, 50 %
    recorder.add(120, 600)   # bin 12, 60 %
    recorder.add(150, 3_333 // 10)  # bin 15, 33.3 %
    curve = recorder.curve(20)
    assert curve[10] == 55.0                 # 100 - mean(40, 50)
    assert curve[11] == pytest.approx(50.0)  # missing: rows of 10..12 -> 100 - mean(40, 50, 60)
    assert curve[12] == 40.0
    assert curve[13] == 40.0                 # neighbours 12..14: only 12
    assert curve[14] == pytest.approx(66.7)  # neighbours 13..15: only 15
    assert curve[15] == pytest.approx(66.7)
    assert 9 in curve and curve[9] == 55.0   # neighbours 8..10
    assert curve[0] == curve[8] == 100.0     # nothing arrived yet: every GPU idle
    assert sorted(curve) == list(range(17))  # demand never reached 17 %: undefined there


def test_recorder_rounds_allocation_to_two_decimals() -> None:
    recorder = _Recorder(3_000)
    recorder.add(0, 1_000)
    assert recorder.sums[0] == 33.33
    assert recorder.curve(0) == {0: 66.67}


def test_recorder_fragmentation_is_the_mean_over_the_pods_of_a_bin() -> None:
    recorder = _Recorder(1_000)
    recorder.add(100, 400, 10.0)   # bin 10
    recorder.add(101, 500, 20.0)   # bin 10
    recorder.add(120, 600, 5.0)    # bin 12
    assert recorder.fragmentation() == {10: 15.0, 12: 5.0}


@pytest.mark.parametrize("batch", [
    pytest.param(fragment_log.BATCH, id="one-batch"),
    pytest.param(3, id="batches-of-3"),  # a flush mid-replay, a node placed on twice in one batch
    pytest.param(1, id="every-pod"),
])
def test_fragmentation_curve_matches_a_full_recount_after_every_pod(batch: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """run_seed refreshes one node's fragmentation per placement, measured in batches; recounting
    every node after every pod agrees."""
    monkeypatch.setattr(fragment_log, "BATCH", batch)
    nodes = gpu_nodes(3, 4)
    pods = [pod(f"p{i}", (130 * i) % 900 + 100) for i in range(12)]
    result = run_seed(nodes, pods, "fgd", seed=5)
    # The same decisions on a fresh ledger, measuring the whole cluster after each pod.
    state = ClusterState(nodes)
    capacity = state.total_compute()
    profile = WorkloadProfile.from_pods(pods)
    rng = np.random.default_rng(5 + 1_000_003)
    tie_rank = np.random.default_rng(5).permutation(state.size).astype(np.int64)
    scheduler = Scheduler(state, make_policy("fgd", rng), profile=profile, tie_rank=tie_rank, rng=rng)
    measure = FragmentationMeasure(state, profile)
    rows = np.arange(state.size, dtype=np.int64)
    sums: dict[int, list[float]] = {}
    arrived = 0
    for arrival in workload(pods, 5, capacity):
        arrived += arrival.gpu_milli_total()
        scheduler.schedule(arrival)
        idle = float(measure.card_free(rows).sum())
        value = 100.0 * float(measure.node_fragment(rows).sum()) / idle if idle else 0.0
        sums.setdefault(round(arrived * 100 / capacity), []).append(value)
    expected = {b: sum(v) / len(v) for b, v in sums.items()}
    assert result.fragmentation_pct.keys() == expected.keys()
    for b, value in expected.items():
        assert result.fragmentation_pct[b] == pytest.approx(value, abs=1e-3), b
    assert any(v > 0 for v in expected.values())  # the trace does fragment the cluster


# ------------------------------------------------------------------------------------ workload


def originals(n: int = 20) -> list[PodRequest]:
    return [pod(f"p{i:02d}", 100 * (i % 10) + 100, count=1 + i % 2 if i % 10 == 9 else 1) for i in range(n)]


def demand(pods: list[PodRequest]) -> int:
    return sum(p.gpu_milli_total() for p in pods)


def test_workload_shuffles_the_originals_then_appends_clones_up_to_130_percent() -> None:
    pods = originals()  # 13,000 milli in all
    capacity = 20_000
    arrivals = workload(pods, seed=42, capacity=capacity)
    head = arrivals[: len(pods)]
    assert sorted(p.key for p in head) == sorted(p.key for p in pods)
    assert [p.key for p in head] != [p.key for p in pods]  # actually shuffled
    clones = arrivals[len(pods):]
    assert clones, "the originals are below 130 %: clones must follow"
    by_key = {p.key: p for p in pods}
    for i, clone in enumerate(clones):
        source, _, number = clone.key.rpartition("-tuned-")
        assert int(number) == i
        assert clone.containers == by_key[source].containers
    total = demand(arrivals)
    assert total <= INFLATION * capacity
    assert total > INFLATION * capacity - max(p.gpu_milli_total() for p in pods)  # ~130 %


@pytest.mark.parametrize("seed", [0, 1, 42, 51])
def test_workload_is_deterministic_per_seed_and_independent_of_input_order(seed: int) -> None:
    pods = originals()
    first = [p.key for p in workload(pods, seed, 20_000)]
    assert any("-tuned-" in key for key in first)
    assert first == [p.key for p in workload(pods, seed, 20_000)]
    assert first == [p.key for p in workload(list(reversed(pods)), seed, 20_000)]


def test_workload_differs_between_seeds() -> None:
    orders = {tuple(p.key for p in workload(originals(), seed, 20_000)) for seed in range(5)}
    assert len(orders) == 5


def test_workload_does_not_clone_when_the_originals_reach_the_target() -> None:
    pods = originals()
    assert len(workload(pods, 3, capacity=demand(pods) * 10 // 13)) == len(pods)


class _CountingPod(PodRequest):
    """A pod that stops a runaway loop: ``gpu_milli_total`` may be asked only so often."""

    calls = 0

    def gpu_milli_total(self) -> int:
        type(self).calls += 1
        if type(self).calls > 20_000:
            raise RuntimeError("workload() keeps drawing clones that add no GPU demand")
        return super().gpu_milli_total()


def test_workload_of_cpu_only_pods_terminates() -> None:
    _CountingPod.calls = 0
    pods = [_CountingPod(key=f"c{i}", containers=(ContainerRequest("main", cpu_milli=100),)) for i in range(3)]
    arrivals = workload(pods, seed=1, capacity=1_000)
    assert sorted(p.key for p in arrivals) == ["c0", "c1", "c2"]


def test_workload_trims_a_trace_above_130_percent() -> None:
    pods = originals()
    capacity = demand(pods) // 2  # the trace asks for 200 %
    assert demand(workload(pods, 7, capacity)) <= INFLATION * capacity


# ------------------------------------------------------------------------------------ replays


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_half_cards_fill_two_nodes_exactly(policy: str) -> None:
    """2 nodes x 2 cards and four 0.5-GPU pods: inflated to ten pods, eight fit, nothing is wasted."""
    pods = [pod(f"half-{i}", 500) for i in range(4)]
    result = run_seed(gpu_nodes(2, 2), pods, policy, seed=42)
    assert (result.pods_total, result.pods_failed) == (10, 2)
    # arrivals are 12.5 % steps: bins 12, 25, 38, 50, 62, 75, 88, 100, 112, 125
    assert result.at(100) == 0.0
    assert result.unallocated_pct[50] == 50.0
    assert result.unallocated_pct[125] == 0.0
    assert result.unallocated_pct[12] == 87.5
    assert result.fragmentation_pct[100] == 0.0
    assert 130 not in result.unallocated_pct


def test_pods_of_a_model_nobody_has_fail_and_are_counted() -> None:
    pods = [pod(f"a-{i}", 500) for i in range(4)] + [pod("z-0", 500, models=frozenset({"Z"}))]
    nodes = gpu_nodes(2, 2)
    arrivals = workload(pods, 5, capacity=4_000)
    wanted_z = sum(1 for p in arrivals if p.key.startswith("z-"))
    good = len(arrivals) - wanted_z
    assert wanted_z >= 1
    for policy in ("fgd", "bestfit"):
        result = run_seed(nodes, pods, policy, seed=5)
        assert result.pods_total == len(arrivals)
        assert result.pods_failed == wanted_z + max(0, good - 8)


def test_whole_card_pods_on_a_model_filtered_cluster() -> None:
    nodes = gpu_nodes(1, 2, model="T4") + gpu_nodes(1, 2, model="V100")
    nodes[1] = dataclasses.replace(nodes[1], name="node-v")
    pods = [pod(f"t4-{i}", 1000, models=frozenset({"T4"})) for i in range(2)]
    result = run_seed(nodes, pods, "fgd", seed=0)
    # T4 pods can use only half the cluster: allocation stops at 50 %
    assert result.pods_total == 5
    assert result.pods_failed == 3
    assert result.unallocated_pct[100] == 50.0


def test_run_seed_is_deterministic_and_reports_progress() -> None:
    # steps of at most 2 % of the 12 cards, so every report point has a bin within one point
    pods = [pod(f"p{i}", m) for i, m in enumerate([100, 150, 200, 240, 120, 0, 180, 240])]
    nodes = gpu_nodes(3, 4)
    ticks: list[int] = []
    first = run_seed(nodes, pods, "gpupool", seed=11, progress=ticks.append)
    second = run_seed(nodes, pods, "gpupool", seed=11)
    assert isinstance(first, SeedResult)
    assert first.seed == 11
    assert (first.unallocated_pct, first.fragmentation_pct, first.pods_failed) == (
        second.unallocated_pct, second.fragmentation_pct, second.pods_failed)
    assert sum(ticks) == first.pods_total
    assert set(REPORT_POINTS) <= set(first.unallocated_pct)
    for point in REPORT_POINTS:
        assert 0.0 <= first.at(point) <= 100.0


def test_unallocated_never_rises_as_demand_arrives() -> None:
    """No departures: the allocated share only grows, so the curve is non-increasing."""
    pods = [pod(f"p{i}", m, count=c) for i, (m, c) in enumerate(
        [(200, 1), (300, 1), (500, 1), (1000, 2), (1000, 1), (250, 1), (900, 1), (1000, 4)])]
    result = run_seed(gpu_nodes(4, 4), pods, "fgd", seed=3)
    points = sorted(result.unallocated_pct)
    values = [result.unallocated_pct[p] for p in points]
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(values))


# ------------------------------------------------------------------------------ bundled trace


@pytest.mark.slow
def test_fgd_on_the_bundled_default_trace() -> None:
    """The paper's setting (openb cluster, default trace, seed 42): FGD leaves ~4-5 % unallocated."""
    from gpupool.sim.trace import load_nodes, load_pods, resolve_nodes, resolve_trace

    nodes = load_nodes(resolve_nodes("openb"))
    pods = [p.request for p in load_pods(resolve_trace("default"))]
    result = run_seed(nodes, pods, "fgd", seed=42)
    assert 3.5 <= result.at(100) <= 6.0


def test_every_decision_is_reported_in_arrival_order() -> None:
    """``on_decision`` sees each arriving pod once, with what was booked for it (bench/sim_placements.py
    hashes these to show that speed work moved no placement)."""
    nodes = gpu_nodes(3, 2)
    pods = [pod(f"p{i}", milli) for i, milli in enumerate((300, 1000, 500, 700, 1000))]
    seen: list[tuple[str, object]] = []
    result = run_seed(nodes, pods, "gpupool", 42, on_decision=lambda p, d: seen.append((p.key, d)))
    capacity = sum(len(n.cards) for n in nodes) * 1000
    assert [key for key, _ in seen] == [p.key for p in workload(pods, 42, capacity)]
    failed = [d for _, d in seen if not isinstance(d, Placement)]
    assert len(seen) == result.pods_total and len(failed) == result.pods_failed
