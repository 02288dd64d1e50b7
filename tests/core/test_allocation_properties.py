"""Allocation invariants under random workloads (hypothesis).

Random small clusters receive random pods (shared slices, whole cards, multi-card requests,
memory-only and compute-only slices, GPU models, several containers, init containers) scheduled by
random policies, interleaved with releases. After every step the ledger must agree with an
independent recomputation from the booked placements, and releasing everything must restore the
initial state exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core.cards import assign_on_node
from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import (
    CardMode,
    ContainerRequest,
    GpuCard,
    GpuKind,
    GpuRequest,
    NodeSpec,
    Placement,
    PodRequest,
    Topology,
)
from gpupool.core.policies import POLICIES, make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from tests.core.builders import ledger_snapshot

POLICY_NAMES = sorted(POLICIES)
MODELS = ("A", "B")


@st.composite
def node_specs(draw: st.DrawFn, name: str) -> NodeSpec:
    n_cards = draw(st.integers(0, 4))
    model = draw(st.sampled_from(MODELS))
    memory = draw(st.sampled_from([8_192, 16_384]))
    kind = draw(st.sampled_from([GpuKind.PHYSICAL, GpuKind.PHYSICAL, GpuKind.VIRTUAL]))
    cards = tuple(GpuCard(index=i, uuid=f"{name}-{i}", model=model, memory_mib=memory, kind=kind,
                          healthy=draw(st.integers(0, 11)) > 0)
                  for i in range(n_cards))
    topology = None
    if n_cards == 4 and draw(st.booleans()):
        topology = Topology.from_tree([[0, 1], [2, 3]], 4)
    return NodeSpec(name=name, cpu_milli=draw(st.sampled_from([2_000, 8_000, 64_000])),
                    memory_mib=draw(st.sampled_from([4_096, 65_536])), cards=cards, topology=topology)


@st.composite
def gpu_requests(draw: st.DrawFn) -> GpuRequest:
    models = frozenset(draw(st.sampled_from([(), (), ("A",), ("B",), ("A", "B"), ("C",)])))
    form = draw(st.sampled_from(["slice", "whole", "multi", "memory", "compute", "both", "kind"]))
    if form == "slice":
        return GpuRequest.fraction(draw(st.integers(1, 999)), 1, models)
    if form == "whole":
        return GpuRequest.whole(draw(st.integers(1, 3)), models)
    if form == "multi":
        return GpuRequest(count=draw(st.integers(2, 3)), compute=draw(st.integers(1, 999)), memory_mib=None,
                          models=models)
    if form == "memory":
        return GpuRequest(compute=0, memory_mib=draw(st.integers(1, 16_384)), models=models)
    if form == "compute":
        return GpuRequest(compute=draw(st.integers(1, 1000)), memory_mib=0, models=models)
    if form == "both":
        return GpuRequest(compute=draw(st.integers(0, 1000)), memory_mib=draw(st.integers(1, 9_000)),
                          models=models)
    return GpuRequest(compute=draw(st.integers(1, 999)), memory_mib=None,
                      kind=draw(st.sampled_from([GpuKind.PHYSICAL, GpuKind.VIRTUAL])))


@st.composite
def containers(draw: st.DrawFn, prefix: str, min_size: int) -> tuple[ContainerRequest, ...]:
    n = draw(st.integers(min_size, 2))
    return tuple(
        ContainerRequest(f"{prefix}{i}", cpu_milli=draw(st.sampled_from([0, 100, 1_000, 3_000])),
                         memory_mib=draw(st.sampled_from([0, 512, 2_048])),
                         gpu=draw(st.one_of(st.none(), gpu_requests(), gpu_requests())))
        for i in range(n))


@st.composite
def pods(draw: st.DrawFn, key: str) -> PodRequest:
    inits = draw(containers("init", 0)) if draw(st.integers(0, 3)) == 0 else ()
    return PodRequest(key=key, containers=draw(containers("c", 1)), init_containers=inits)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[NodeSpec], list[tuple[str, object, str]]]:
    nodes = [draw(node_specs(f"n{i}")) for i in range(draw(st.integers(1, 3)))]
    ops: list[tuple[str, object, str]] = []
    for i in range(draw(st.integers(1, 18))):
        if draw(st.integers(0, 3)) == 0:
            ops.append(("release", draw(st.integers(0, 50)), ""))
        else:
            ops.append(("schedule", draw(pods(f"pod-{i}")), draw(st.sampled_from(POLICY_NAMES))))
    return nodes, ops


# ------------------------------------------------------------------------------------- oracles


def check_placement_honours_the_pod(state: ClusterState, placement: Placement, pod: PodRequest) -> None:
    """Every container got what it asked for, on allowed cards, in the amounts the request implies."""
    spec = state.specs[state.index[placement.node]]
    assert placement.pod_key == pod.key
    assert (placement.cpu_milli, placement.memory_mib) == (pod.cpu_milli, pod.memory_mib)
    got = {(a.container, a.init): a for a in placement.containers}
    wanted = [(c, False) for c in pod.containers] + [(c, True) for c in pod.init_containers]
    assert len(got) == sum(1 for c, _ in wanted if c.gpu is not None)
    for container, init in wanted:
        if container.gpu is None:
            assert (container.name, init) not in got
            continue
        request = container.gpu
        assignment = got[(container.name, init)]
        assert len(assignment.slices) == request.count
        assert len(set(assignment.cards)) == request.count
        for s in assignment.slices:
            card = spec.cards[s.card]
            assert request.allows(card), (request, card)
            assert s.exclusive == request.exclusive
            assert s.memory_mib == request.memory_on(card)
            assert s.compute == request.compute_on(card)


def check_ledger(state: ClusterState) -> None:
    """The ledger equals totals minus what the placements hold; modes and exclusivity are sound."""
    exists = state.card_exists
    for name, free, total in (("memory", state.card_mem_free, state.card_mem_total),
                              ("compute", state.card_compute_free, state.card_compute_total)):
        assert (free[exists] >= 0).all(), f"negative free {name}"
        assert (free[exists] <= total[exists]).all(), f"free {name} above total"
    present = state.present[: state.size]
    assert (state.cpu_free[: state.size][present] >= 0).all()
    assert (state.mem_free[: state.size][present] >= 0).all()

    mem_free = state.card_mem_total.copy()
    compute_free = state.card_compute_total.copy()
    cpu_free = state.cpu_total.copy()
    node_mem_free = state.mem_total.copy()
    exclusive_holders: dict[tuple[int, int], list[str]] = {}
    shared_holders: dict[tuple[int, int], list[str]] = {}
    for key, placement in state.placements.items():
        row = state.index[placement.node]
        cpu_free[row] -= placement.cpu_milli
        node_mem_free[row] -= placement.memory_mib
        for card, (memory, compute, exclusive) in placement.held_per_card().items():
            if exclusive:
                exclusive_holders.setdefault((row, card), []).append(key)
                mem_free[row, card] = 0
                compute_free[row, card] = 0
            else:
                shared_holders.setdefault((row, card), []).append(key)
                mem_free[row, card] -= memory
                compute_free[row, card] -= compute
    np.testing.assert_array_equal(state.card_mem_free[exists], mem_free[exists])
    np.testing.assert_array_equal(state.card_compute_free[exists], compute_free[exists])
    np.testing.assert_array_equal(state.cpu_free[: state.size][present], cpu_free[: state.size][present])
    np.testing.assert_array_equal(state.mem_free[: state.size][present], node_mem_free[: state.size][present])
    for (row, card), keys in exclusive_holders.items():
        assert len(keys) == 1, f"card {row}/{card} held exclusively by {keys}"
        assert (row, card) not in shared_holders, f"exclusive card {row}/{card} mixed with slices"
        assert state.card_mode[row, card] == CardMode.EXCLUSIVE
    for (row, card), keys in shared_holders.items():
        assert state.card_mode[row, card] == CardMode.SHARED
        assert state.card_holders[row, card] == len(keys)
    held = set(exclusive_holders) | set(shared_holders)
    for row, card in zip(*np.nonzero(exists), strict=True):
        if (int(row), int(card)) not in held:
            assert state.card_mode[row, card] == CardMode.IDLE
            assert state.card_mem_free[row, card] == state.card_mem_total[row, card]
            assert state.card_compute_free[row, card] == state.card_compute_total[row, card]


# ------------------------------------------------------------------------------------ properties


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(0, 2**16))
def test_random_workloads_keep_the_ledger_sound(scenario: tuple[list[NodeSpec], list], seed: int) -> None:
    nodes, ops = scenario
    state = ClusterState(nodes)
    initial = ledger_snapshot(state)
    profile = WorkloadProfile.from_pods([p for kind, p, _ in ops if kind == "schedule"])  # type: ignore[misc]
    booked: list[str] = []
    for kind, payload, policy_name in ops:
        if kind == "release":
            if booked:
                key = booked.pop(int(payload) % len(booked))  # type: ignore[call-overload]
                assert state.release(key) is not None
        else:
            pod = payload
            assert isinstance(pod, PodRequest)
            rng = np.random.default_rng(seed)
            scheduler = Scheduler(state, make_policy(policy_name, rng), profile=profile, rng=rng)
            decision = scheduler.decide(pod)
            if isinstance(decision, Placement):
                assert state.check(decision) is None
                check_placement_honours_the_pod(state, decision, pod)
                state.apply(decision)
                booked.append(pod.key)
            elif policy_name != "random":
                # nothing was missed: no node can hold the pod with this policy's card choice
                chooser = scheduler.policy.shared_chooser()
                for row in range(state.size):
                    assert not isinstance(assign_on_node(state, row, pod, chooser), Placement), (
                        decision, state.specs[row].name)
        check_ledger(state)
    for key in reversed(booked):
        state.release(key)
    assert state.placements == {}
    final = ledger_snapshot(state)
    for name, array in initial.items():
        np.testing.assert_array_equal(final[name], array, err_msg=name)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from(POLICY_NAMES), st.integers(0, 2**16))
def test_score_cache_never_changes_a_decision(scenario: tuple[list[NodeSpec], list], policy_name: str,
                                              seed: int) -> None:
    """The scheduler caches scores per request shape; decisions must equal uncached ones."""
    nodes, ops = scenario
    pods_ = [p for kind, p, _ in ops if kind == "schedule"]
    profile = WorkloadProfile.from_pods(pods_)  # type: ignore[arg-type]
    tie_rank = np.random.default_rng(seed).permutation(len(nodes)).astype(np.int64)
    runs = []
    for cache in (True, False):
        state = ClusterState(nodes)
        rng = np.random.default_rng(seed)
        scheduler = Scheduler(state, make_policy(policy_name, rng), profile=profile, tie_rank=tie_rank,
                              rng=rng, cache=cache)
        decisions = []
        booked: list[str] = []
        for kind, payload, _ in ops:
            if kind == "release":
                if booked:
                    state.release(booked.pop(int(payload) % len(booked)))  # type: ignore[call-overload]
                continue
            decision = scheduler.schedule(payload)  # type: ignore[arg-type]
            decisions.append(decision)
            if isinstance(decision, Placement):
                booked.append(decision.pod_key)
        runs.append(decisions)
    assert runs[0] == runs[1]
