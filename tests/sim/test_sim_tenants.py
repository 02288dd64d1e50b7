"""Replay with tenants and quotas: the extender's quota rules, per tenant, through the core."""

from __future__ import annotations

from gpupool.core.model import ContainerRequest, GpuCard, GpuRequest, NodeSpec, Placement, PodRequest
from gpupool.core.policies import make_policy
from gpupool.core.quota import Limits, ModelSizes, Quota
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from gpupool.sim.tenants import decide_with_quotas, replay_tenants
from gpupool.sim.trace import TracePod


def node(name: str, model: str, cards: int = 2) -> NodeSpec:
    return NodeSpec(name, 32_000, 128_000, tuple(GpuCard(i, f"{name}-{i}", model, 16_384) for i in range(cards)))


def trace_pod(name: str, qos: str, milli: int, start: int, end: int | None) -> TracePod:
    gpu = GpuRequest.fraction(milli)
    return TracePod(PodRequest(name, (ContainerRequest("main", 1_000, 1_024, gpu),)), start, end, qos)


def test_a_quota_caps_its_tenant_and_leaves_the_other_alone() -> None:
    nodes = [node("a", "T4", 4), node("b", "T4", 4)]
    pods = [trace_pod(f"ls{i}", "LS", 500, i, 100) for i in range(8)] + \
           [trace_pod(f"be{i}", "BE", 500, i, 100) for i in range(4)]
    reports = replay_tenants(nodes, pods, "bestfit", {"LS": [Quota("LS/q", "LS", Limits(compute=2_000))]})
    ls, be = reports["LS"], reports["BE"]
    assert (ls.arrived, ls.placed, ls.refused_by_quota) == (8, 4, 4)
    assert ls.peak_compute == 2_000
    assert ls.first_quota_reason == "GpuQuota LS/q: GPU compute (percent of one GPU) limit 200, used 200, asked 50"
    assert (be.placed, be.refused_by_quota, be.peak_compute) == (4, 0, 2_000)


def test_departures_give_quota_back() -> None:
    nodes = [node("a", "T4")]
    pods = [trace_pod("first", "LS", 1_000, 0, 10), trace_pod("second", "LS", 1_000, 10, None)]
    reports = replay_tenants(nodes, pods, "bestfit", {"LS": [Quota("LS/q", "LS", Limits(cards=1))]})
    assert reports["LS"].placed == 2


def test_a_model_without_room_is_avoided_rather_than_refused() -> None:
    state = ClusterState([node("v", "V100", 1), node("t", "T4", 1)])
    scheduler = Scheduler(state, make_policy("bestfit"))
    quota = Quota("LS/q", "LS", per_model=(("V100", Limits(cards=0)),))
    pod = PodRequest("LS/p", (ContainerRequest("main", gpu=GpuRequest.whole()),))
    decision = decide_with_quotas(scheduler, ModelSizes(), pod, [quota])
    assert isinstance(decision, Placement) and decision.node == "t"
    state.apply(decision)
    assert decide_with_quotas(scheduler, ModelSizes(), PodRequest("LS/q", pod.containers), [quota]) == \
        "GpuQuota LS/q, GPU model V100: whole GPUs limit 0, used 0, asked 1"
