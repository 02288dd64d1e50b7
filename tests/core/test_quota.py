"""Quotas: the verdict, demand estimates, and the ledger's usage tally they count from."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core.model import CardSlice, ContainerRequest, GpuRequest, Placement, PodRequest
from gpupool.core.policies import make_policy
from gpupool.core.quota import Limits, ModelSizes, Quota, pod_amounts, quota_verdict, refused_models
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from gpupool.core.usage import Amounts, placement_use, tenant_of
from tests.core.builders import make_node, mem_pod, raw_placement, slice_pod

A = "A"
Q = Quota("team/q", "team", Limits(memory_mib=32_768, compute=2_000, cards=1),
          per_model=(("B", Limits(compute=500)),))


@pytest.mark.parametrize(("used", "asked", "reason"), [
    pytest.param({}, {A: Amounts(16_384, 1_000, 1)}, None, id="room"),
    pytest.param({A: Amounts(16_384, 1_000, 1)}, {A: Amounts(16_384, 1_000, 1)},
                 "GpuQuota team/q: whole GPUs limit 1, used 1, asked 1", id="whole-cards"),
    pytest.param({A: Amounts(30_000, 100)}, {A: Amounts(4_096, 100)},
                 "GpuQuota team/q: GPU memory limit 32768 MiB, used 30000 MiB, asked 4096 MiB", id="memory"),
    pytest.param({A: Amounts(0, 1_900)}, {A: Amounts(0, 200)},
                 "GpuQuota team/q: GPU compute (percent of one GPU) limit 200, used 190, asked 20", id="compute"),
    pytest.param({"B": Amounts(0, 400)}, {"B": Amounts(0, 200)},
                 "GpuQuota team/q, GPU model B: GPU compute (percent of one GPU) limit 50, used 40, asked 20",
                 id="per-model"),
    pytest.param({"B": Amounts(0, 400)}, {A: Amounts(0, 200)}, None, id="other-model-free"),
    pytest.param({A: Amounts(40_000, 0)}, {A: Amounts(0, 100)}, None, id="over-in-a-dimension-not-asked"),
])
def test_verdict_names_the_limit_what_is_used_and_what_is_asked(used: dict[str, Amounts], asked: dict[str, Amounts],
                                                                 reason: str | None) -> None:
    assert quota_verdict([Q], used, asked) == reason


def test_every_quota_of_the_tenant_applies() -> None:
    loose = Quota("team/loose", "team", Limits(cards=10))
    tight = Quota("team/tight", "team", Limits(cards=0))
    assert quota_verdict([loose, tight], {}, {A: Amounts(1, 1, 1)}) == \
        "GpuQuota team/tight: whole GPUs limit 0, used 0, asked 1"


@pytest.mark.parametrize(("pod", "amounts"), [
    pytest.param(slice_pod("p", 250), Amounts(4_096, 250), id="proportional"),
    pytest.param(slice_pod("p", 1_000, count=2), Amounts(32_768, 2_000, 2), id="whole-cards"),
    pytest.param(mem_pod("p", 5_000), Amounts(5_000, 0), id="memory-only"),
    pytest.param(PodRequest("p", (ContainerRequest("a", gpu=GpuRequest(compute=100, memory_mib=1_000)),),
                            (ContainerRequest("i", gpu=GpuRequest(compute=50, memory_mib=9_000)),)),
                 Amounts(9_000, 100), id="init-larger-in-memory"),
])
def test_pod_amounts(pod: PodRequest, amounts: Amounts) -> None:
    assert pod_amounts(pod, 16_384) == amounts


def test_refused_models_estimate_on_each_models_largest_card() -> None:
    state = ClusterState([make_node("a", [16_384, 40_960]), make_node("b", 2, model="B")])
    sizes = ModelSizes().of(state)
    assert sizes == {"A": 40_960, "B": 16_384}
    quota = Quota("t/q", "t", per_model=(("A", Limits(memory_mib=20_000)),))
    assert refused_models([quota], {}, slice_pod("t/p", 500), sizes) == {
        "A": "GpuQuota t/q, GPU model A: GPU memory limit 20000 MiB, used 0 MiB, asked 20480 MiB"}
    assert refused_models([], {}, slice_pod("t/p", 500), sizes) == {}


def test_usage_is_counted_from_bookings_per_tenant_and_model() -> None:
    state = ClusterState([make_node("a", 2), make_node("b", 1, model="B")])
    state.apply(raw_placement("t1/x", "a", [CardSlice(0, 4_096, 250), CardSlice(1, 4_096, 250)]))
    state.claim(raw_placement("t1/y", "b", [CardSlice(0, 16_384, 1_000, exclusive=True)]))
    state.apply(raw_placement("t2/z", "a", [CardSlice(0, 1_000, 100)]))
    assert state.usage.of("t1") == {"A": Amounts(8_192, 500), "B": Amounts(16_384, 1_000, 1)}
    state.release("t1/x")
    assert state.usage.of("t1") == {"B": Amounts(16_384, 1_000, 1)}
    state.upsert_node(make_node("b", 1, model="C"))  # re-derived: counted under the card's new model
    assert state.usage.of("t1") == {"C": Amounts(16_384, 1_000, 1)}
    state.remove_node("b")
    assert state.usage.of("t1") == {}
    assert state.usage.of("t2") == {"A": Amounts(1_000, 100)}
    assert tenant_of("trace-pod") == ""


def recount(state: ClusterState, tenant: str) -> dict[str, Amounts]:
    use: dict[str, Amounts] = {}
    for key, placement in state.placements.items():
        if tenant_of(key) == tenant:
            spec = state.specs[state.index[placement.node]]
            for model, amounts in placement_use(placement, spec).items():
                use[model] = use.get(model, Amounts()) + amounts
    return use


TENANTS = ("t1", "t2", "t3")


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["pod", "pod", "pod", "release", "node"]), st.sampled_from(TENANTS),
                          st.sampled_from([100, 300, 500, 1_000]), st.integers(0, 3)), max_size=40),
       st.integers(0, 3), st.integers(0, 2_000))
def test_quota_checked_before_every_booking_is_never_exceeded(steps: list[tuple[str, str, int, int]], cards: int,
                                                              compute: int) -> None:
    """Pods of three tenants arrive and leave, nodes change; every booking is checked first against the
    tenant's quota with the usage the ledger holds. Usage then never passes a limit and always equals a
    recount of the placements."""
    state = ClusterState([make_node(f"n{i}", 4, model="AB"[i % 2]) for i in range(3)])
    scheduler = Scheduler(state, make_policy("bestfit"))
    quotas = {t: Quota(f"{t}/q", t, Limits(cards=cards, compute=compute)) for t in TENANTS}
    for i, (action, tenant, milli, n) in enumerate(steps):
        if action == "pod":
            decision = scheduler.decide(slice_pod(f"{tenant}/p{i}", milli))
            if isinstance(decision, Placement):
                spec = state.specs[state.index[decision.node]]
                if quota_verdict([quotas[tenant]], state.usage.of(tenant), placement_use(decision, spec)) is None:
                    state.apply(decision)
        elif action == "release" and state.placements:
            state.release(sorted(state.placements)[n % len(state.placements)])
        elif action == "node":
            state.upsert_node(make_node(f"n{n % 3}", 4, model="AB"[(n + i) % 2]))
        for t in TENANTS:
            held = state.usage.of(t)
            assert held == recount(state, t)
            summed = sum((a for a in held.values()), Amounts())
            assert summed.cards <= cards and summed.compute <= compute
