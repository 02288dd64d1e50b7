"""CPU–GPU balance: the stranded-GPU measure and what it changes in gpupool's choices."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.balance import cpu_only_kappa, cpu_per_gpu_milli, stranded_gpu, stranding_increase
from gpupool.core.fragmentation import TypicalPod, WorkloadProfile
from gpupool.core.model import Placement
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from gpupool.sim.packing import run_seed
from tests.core.builders import cpu_pod, make_node, slice_pod

#: One GPU pod shape: a whole card with 5 cores, i.e. 5 CPU milli per milli-GPU.
WHOLE_5_CORES = TypicalPod(cpu_milli=5_000, milli=1000, count=1, models=frozenset(), freq=1.0)


def test_kappa_is_the_frequency_weighted_cpu_per_milli_gpu_of_gpu_pods() -> None:
    profile = WorkloadProfile((
        TypicalPod(cpu_milli=4_000, milli=500, count=1, models=frozenset(), freq=0.5),
        TypicalPod(cpu_milli=16_000, milli=1000, count=2, models=frozenset(), freq=0.25),
        TypicalPod(cpu_milli=8_000, milli=0, count=0, models=frozenset(), freq=0.25),  # CPU only: ignored
    ))
    # (0.5 * 4000 + 0.25 * 16000) / (0.5 * 500 + 0.25 * 2000) = 6000 / 750
    assert cpu_per_gpu_milli(profile) == pytest.approx(8.0)


def test_kappa_is_none_without_gpu_pods() -> None:
    assert cpu_per_gpu_milli(WorkloadProfile(())) is None
    only_cpu = TypicalPod(cpu_milli=8_000, milli=0, count=0, models=frozenset(), freq=1.0)
    assert cpu_per_gpu_milli(WorkloadProfile((only_cpu,))) is None


def test_stranded_gpu_is_the_free_gpu_the_free_cpu_cannot_feed() -> None:
    gpu_free = np.array([2000.0, 2000.0, 0.0, 500.0])
    cpu_free = np.array([12_000.0, 5_000.0, 0.0, 64_000.0])
    assert stranded_gpu(gpu_free, cpu_free, 5.0).tolist() == [0.0, 1000.0, 0.0, 0.0]


def test_stranding_increase_of_cpu_only_and_gpu_pods() -> None:
    gpu_free = np.array([2000.0, 2000.0])
    cpu_free = np.array([12_000.0, 64_000.0])
    # 6 cores leave 6 cores for 2 GPUs: 800 milli-GPU stranded on the tight node, none on the rich one.
    assert stranding_increase(gpu_free, cpu_free, 5.0, 0.0, 6_000.0).tolist() == [800.0, 0.0]
    # A GPU pod with less CPU than kappa per GPU relieves a node that is already short of CPU.
    short = stranding_increase(np.array([2000.0]), np.array([5_000.0]), 5.0, 1000.0, 1_000.0)
    assert short.tolist() == [-800.0]


def test_gpupool_sends_a_cpu_only_pod_where_it_strands_no_gpu_although_ties_prefer_the_other() -> None:
    # n0: 2 cards, 12 cores; n1: 2 cards, 64 cores. 6 cores on n0 would leave one card unfed, which
    # FGD's measure cannot see (one 5-core pod still fits): FGD follows the node order, gpupool not.
    state = ClusterState([make_node("n0", 2, cpu=12_000), make_node("n1", 2, cpu=64_000)])
    profile = WorkloadProfile((WHOLE_5_CORES,))
    prefer_n0 = np.array([0, 1], dtype=np.int64)
    for name, node in (("fgd", "n0"), ("gpupool", "n1")):
        scheduler = Scheduler(state, make_policy(name), profile=profile, tie_rank=prefer_n0)
        decision = scheduler.decide(cpu_pod("batch", cpu=6_000))
        assert isinstance(decision, Placement)
        assert decision.node == node, name


def test_on_a_cpu_tight_cluster_balance_places_every_pod_that_fgd_can_strand() -> None:
    """Known answer: 1 CPU-only pod of 6 cores and 4 whole-card pods of 5 cores on 2 x 2 cards.

    All four GPU pods run only if the CPU pod avoids the 12-core node (12 - 6 = 6 cores feed one card,
    not two). gpupool gets it right for every arrival order; FGD depends on the node order for ties.
    """
    nodes = [make_node("tight", 2, cpu=12_000), make_node("rich", 2, cpu=64_000)]
    pods = [cpu_pod("a-batch", cpu=6_000)] + [slice_pod(f"b-gpu-{i}", 1000, cpu=5_000) for i in range(4)]
    seeds = range(20)
    assert [run_seed(nodes, pods, "gpupool", seed=s).at(100) for s in seeds] == [0.0] * len(seeds)
    assert any(run_seed(nodes, pods, "fgd", seed=s).at(100) > 0.0 for s in seeds)


def test_cpu_only_pods_measure_against_a_larger_reserve() -> None:
    assert cpu_only_kappa(5.0, 5.0) == pytest.approx(25.0)
    assert cpu_only_kappa(5.0, 1.0) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="at least 1 x kappa"):
        cpu_only_kappa(5.0, 0.5)


def test_gpupool_sends_a_cpu_only_pod_to_a_node_without_free_gpu_before_a_cpu_rich_one() -> None:
    # rich: 2 free cards and 40 cores, 8 per card above the workload's 5 (kappa): at kappa an
    # 8-core pod strands nothing there, exactly as on n-full, whose only card is taken. Only the
    # CPU-only reserve (5 x kappa) tells them apart; the node order prefers rich.
    state = ClusterState([make_node("rich", 2, cpu=40_000), make_node("n-full", 1, cpu=32_000)])
    profile = WorkloadProfile((WHOLE_5_CORES,))
    prefer_rich = np.array([0, 1], dtype=np.int64)
    scheduler = Scheduler(state, make_policy("gpupool"), profile=profile, tie_rank=prefer_rich)
    assert isinstance(scheduler.assign(slice_pod("taken", 1000, cpu=5_000), "n-full"), Placement)
    decision = scheduler.decide(cpu_pod("batch", cpu=8_000))
    assert isinstance(decision, Placement)
    assert decision.node == "n-full"
    # at the GPU pods' own ratio (reserve 1) both strand nothing and the node order decides
    policy = make_policy("gpupool")
    policy.cpu_only_reserve = 1.0  # type: ignore[attr-defined]
    same_ratio = Scheduler(state, policy, profile=profile, tie_rank=prefer_rich).decide(cpu_pod("batch", cpu=8_000))
    assert isinstance(same_ratio, Placement)
    assert same_ratio.node == "rich"


def test_when_cpu_runs_short_cpu_only_pods_leave_the_cpu_rich_node_to_cpu_heavy_gpu_pods() -> None:
    """Known answer: the CPU-heavy GPU pods (16 cores per card) fit only on the 40-core node, and only
    if the 12-core CPU-only pod goes to the CPU node; at the GPU pods' average ratio (9 cores per card)
    the 40-core node looks as good for it (28 cores still feed its 2 cards) and the node order decides.
    """
    nodes = [make_node("rich", 2, cpu=40_000), make_node("tight", 2, cpu=10_000),
             make_node("cpu", 0, cpu=12_000)]
    pods = ([cpu_pod("a-batch", cpu=12_000)] + [slice_pod(f"b-heavy-{i}", 1000, cpu=16_000) for i in range(2)]
            + [slice_pod(f"c-light-{i}", 1000, cpu=2_000) for i in range(2)])
    seeds = range(20)
    assert [run_seed(nodes, pods, "gpupool", seed=s).at(100) for s in seeds] == [0.0] * len(seeds)
    assert any(run_seed(nodes, pods, "fgd", seed=s).at(100) > 0.0 for s in seeds)
