"""GPU-model scarcity: the measure and what it changes in gpupool's choices."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.feasibility import card_fit_mask
from gpupool.core.fragmentation import TypicalPod, WorkloadProfile
from gpupool.core.model import Placement
from gpupool.core.policies import PodShape, make_policy
from gpupool.core.policies.gpupool_policy import GpupoolPolicy
from gpupool.core.scarcity import model_scarcity
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from tests.core.builders import make_node, slice_pod


def typical(milli: int, freq: float, models: tuple[str, ...] = (), count: int = 1) -> TypicalPod:
    return TypicalPod(cpu_milli=1_000, milli=milli, count=count, models=frozenset(models), freq=freq)


def test_scarcity_is_restricted_demand_share_over_capacity_share() -> None:
    profile = WorkloadProfile((typical(1000, 0.8), typical(1000, 0.2, ("T4",))))
    # T4 is a quarter of the capacity and a fifth of the demand is restricted to it.
    assert model_scarcity(profile, {"T4": 1000, "G2": 3000}) == pytest.approx({"T4": 0.2 / 0.25})


def test_a_set_of_models_spreads_its_demand_by_capacity_and_absent_models_are_ignored() -> None:
    profile = WorkloadProfile((typical(500, 0.5), typical(500, 0.5, ("V100", "P100", "H100"))))
    scarcity = model_scarcity(profile, {"V100": 1000, "P100": 3000, "G2": 4000})  # no H100 here
    # restricted share 0.5 split 1:3 over V100 (1/8 of capacity) and P100 (3/8)
    assert scarcity == pytest.approx({"V100": 0.125 / 0.125, "P100": 0.375 / 0.375})


def test_no_restricted_pods_or_no_gpu_pods_means_no_scarcity() -> None:
    assert model_scarcity(WorkloadProfile((typical(1000, 1.0),)), {"T4": 1000}) == {}
    only_cpu = TypicalPod(cpu_milli=1_000, milli=0, count=0, models=frozenset(), freq=1.0)
    assert model_scarcity(WorkloadProfile((only_cpu,)), {"T4": 1000}) == {}
    assert model_scarcity(WorkloadProfile(()), {}) == {}


@pytest.mark.parametrize(("milli", "count"), [(1000, 1), (300, 1), (1000, 2)])
def test_placing_on_a_scarce_model_costs_weight_times_gpu_times_scarcity(milli: int, count: int) -> None:
    state = ClusterState([make_node("t4", 2, model="T4"), make_node("g2", 2, model="G2")])
    profile = WorkloadProfile((typical(1000, 0.95), typical(1000, 0.05, ("T4",))))
    pod = slice_pod("p", milli, count=count)
    shape = PodShape.of(pod)
    rows = np.arange(state.size, dtype=np.int64)
    fits = card_fit_mask(state, pod.containers[0].gpu, rows)  # type: ignore[arg-type]
    gains = {}
    for weight in (0.0, GpupoolPolicy.scarcity_weight):
        policy = make_policy("gpupool")
        assert isinstance(policy, GpupoolPolicy)
        policy.scarcity_weight = weight
        policy.prepare(state, profile)
        gains[weight] = policy.card_gains(state, shape, rows, fits)[:, :2]  # the two real cards
    scarcity_t4 = 0.05 / 0.5  # restricted share over T4's share of the capacity
    cost = gains[0.0] - gains[GpupoolPolicy.scarcity_weight]
    assert cost[state.index["t4"]] == pytest.approx([0.25 * milli * count * scarcity_t4] * 2)
    assert cost[state.index["g2"]] == pytest.approx([0.0, 0.0])


def test_unrestricted_pods_move_off_a_scarce_model_where_fragmentation_alone_ties() -> None:
    # 5 % of the workload may only run on T4: FGD's gain differs by 50 milli between the nodes,
    # inside one of gpupool's bins, so without the scarcity term the node order decides.
    state = ClusterState([make_node("t4", 2, model="T4"), make_node("g2", 2, model="G2")])
    profile = WorkloadProfile((typical(1000, 0.95), typical(1000, 0.05, ("T4",))))
    chosen = {}
    for weight in (0.0, 1.0):
        policy = make_policy("gpupool")
        assert isinstance(policy, GpupoolPolicy)
        policy.scarcity_weight = weight
        tie_rank = np.array([0, 1], dtype=np.int64)  # t4 first
        decision = Scheduler(state, policy, profile=profile, tie_rank=tie_rank).decide(slice_pod("p", 1000))
        assert isinstance(decision, Placement)
        chosen[weight] = decision.node
    assert chosen == {0.0: "t4", 1.0: "g2"}


def test_scarcity_table_follows_nodes_joining_the_cluster() -> None:
    state = ClusterState([make_node("g2", 2, model="G2")])
    profile = WorkloadProfile((typical(1000, 0.5), typical(1000, 0.5, ("T4",))))
    policy = make_policy("gpupool")
    assert isinstance(policy, GpupoolPolicy)
    policy.prepare(state, profile)
    assert policy.scarcity_by_model_id(state).tolist() == [0.0, 0.0]  # no T4 in the cluster yet
    state.upsert_node(make_node("t4", 2, model="T4"))
    table = policy.scarcity_by_model_id(state)
    assert table[state.model_id("T4") + 1] == pytest.approx(0.5 / 0.5)
    assert table[state.model_id("G2") + 1] == 0.0
