"""Nodes in identical states evaluated once (gpupool.core.row_groups): the same feasibility, scores
and cards as evaluating every node, on random ledgers, policies and pod shapes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.card_scope import CardScope, CardSet
from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import GpuKind, GpuRequest, PodRequest, Topology
from gpupool.core.pod_policy import PolicyChoice
from gpupool.core.policies import make_policy
from gpupool.core.row_groups import RowGroups
from gpupool.core.scheduler import GroupRows, Scheduler, Unschedulable
from gpupool.core.state import ClusterState, IntArray
from tests.core.builders import CountingPolicy, cpu_pod, make_node, mem_pod, pod_with, slice_pod

POLICIES = ("gpupool", "binpack", "fgd", "spread", "bestfit", "dotprod", "packing", "dra-allocator", "dra-steered")


@contextmanager
def group_every_call() -> Iterator[None]:
    """Grouping from the first row (the shipped threshold would leave these small ledgers alone)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("gpupool.core.scheduler.GROUP_FROM_ROWS", 1)
        yield


def machines(draw: st.DrawFn) -> list[tuple[int, str, int, bool]]:
    """A few kinds of machine (cards, model, CPU, NVLink topology), each used by many nodes."""
    return draw(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from(["A", "B"]),
                                   st.sampled_from([16_000, 64_000]), st.booleans()), min_size=1, max_size=3))


def cluster(kinds: list[tuple[int, str, int, bool]], nodes: int) -> ClusterState:
    specs = []
    for i in range(nodes):
        cards, model, cpu, linked = kinds[i % len(kinds)]
        topology = Topology.from_tree([[0, 1], [2, 3]], cards) if linked and cards == 4 else None
        specs.append(make_node(f"n{i:03d}", cards, model=model, cpu=cpu, topology=topology))
    return ClusterState(specs)


def scope_on(nodes: int) -> CardScope:
    return CardScope("group g", within=(CardSet(nodes=frozenset(f"n{i:03d}" for i in range(0, nodes, 3))),))


@st.composite
def pods(draw: st.DrawFn, key: str, nodes: int) -> PodRequest:
    """Slices, memory slices, whole and several cards, CPU-only, model- and kind-bound, scoped, per-pod."""
    cpu = draw(st.sampled_from([500, 1_000, 4_000]))
    form = draw(st.sampled_from(["slice", "mem", "whole", "multi", "cpu", "model", "kind", "scope", "per-pod"]))
    if form == "cpu":
        return cpu_pod(key, cpu=cpu)
    if form == "mem":
        return mem_pod(key, draw(st.sampled_from([2_048, 8_192])), cpu=cpu)
    milli = draw(st.sampled_from([250, 500, 1_000]))
    if form == "whole":
        return slice_pod(key, 1_000, count=draw(st.sampled_from([1, 2])), cpu=cpu)
    if form == "multi":
        return slice_pod(key, milli, count=2, cpu=cpu)
    if form == "model":
        return slice_pod(key, milli, cpu=cpu, models=("B",))
    if form == "kind":
        return pod_with(key, GpuRequest(compute=milli, memory_mib=None, kind=GpuKind.PHYSICAL), cpu=cpu)
    pod = slice_pod(key, milli, cpu=cpu)
    if form == "scope":
        container = pod.containers[0]
        assert container.gpu is not None
        gpu = dataclasses.replace(container.gpu, scope=scope_on(nodes))
        return dataclasses.replace(pod, containers=(dataclasses.replace(container, gpu=gpu),))
    if form == "per-pod":
        return dataclasses.replace(pod, policy=PolicyChoice(node=draw(st.sampled_from(["binpack", "spread"]))))
    return pod


def schedulers(state: ClusterState, policy: str, profile: WorkloadProfile) -> dict[GroupRows, Scheduler]:
    tie = np.arange(state.size, dtype=np.int64)
    return {mode: Scheduler(state, make_policy(policy, np.random.default_rng(3)), profile=profile, tie_rank=tie,
                            group_rows=mode) for mode in ("never", "always")}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), policy=st.sampled_from(POLICIES), nodes=st.integers(6, 40))
def test_grouped_evaluation_decides_as_every_node(data: st.DataObject, policy: str, nodes: int) -> None:
    """Two ledgers filled alike; the grouped scheduler and the per-node one see the same pods, with
    random bookings, releases and health changes between, and answer alike for every pod."""
    kinds = data.draw(st.composite(machines)())
    ledgers = [cluster(kinds, nodes), cluster(kinds, nodes)]
    profile = WorkloadProfile.from_pods([slice_pod("t1", 250), slice_pod("t2", 500), slice_pod("t3", 1_000, count=2),
                                         cpu_pod("t4")])
    per_node = schedulers(ledgers[0], policy, profile)["never"]
    grouped = schedulers(ledgers[1], policy, profile)["always"]
    booked: list[str] = []
    with group_every_call():
        for i in range(data.draw(st.integers(5, 30))):
            pod = data.draw(pods(f"p{i}", nodes))
            rows_a, scores_a = per_node.filter_and_score(pod)
            rows_b, scores_b = grouped.filter_and_score(pod)
            np.testing.assert_array_equal(rows_a, rows_b)
            np.testing.assert_array_equal(scores_a, scores_b)
            chosen = per_node.decide(pod), grouped.decide(pod)
            assert chosen[0] == chosen[1]
            if not isinstance(chosen[0], Unschedulable):
                for state, placement in zip(ledgers, chosen, strict=True):
                    state.apply(placement)  # type: ignore[arg-type]
                booked.append(pod.key)
            action = data.draw(st.sampled_from(["none", "none", "release", "health"]))
            if action == "release" and booked:
                gone = booked.pop(data.draw(st.integers(0, len(booked) - 1)))
                for state in ledgers:
                    state.release(gone)
            elif action == "health":
                node, healthy = f"n{data.draw(st.integers(0, nodes - 1)):03d}", data.draw(st.booleans())
                for state in ledgers:
                    state.set_card_health(node, 0, healthy)


class GroupedCountingPolicy(CountingPolicy):
    """gpupool's scores, counting the rows scored, declared groupable (scores read the ledger row
    only, and cost more than numbering states)."""

    scores_from_ledger_rows = True
    scores_dearly = True

    def __init__(self) -> None:
        super().__init__(make_policy("gpupool"))


def test_a_fresh_cluster_is_scored_once_per_state() -> None:
    state = ClusterState([make_node(f"n{i}", 4) for i in range(40)])
    policy = GroupedCountingPolicy()
    sched = Scheduler(state, policy, profile=WorkloadProfile.from_pods([slice_pod("t", 500)]))
    first = slice_pod("a", 500)
    placement = sched.schedule(first)
    assert not isinstance(placement, Unschedulable)
    with group_every_call():
        sched.filter_and_score(slice_pod("b", 250))
    assert policy.rows_scored == 40 + 2  # the first shape on every node; then the empty nodes and n-used
    policy.rows_scored = 0
    sched.filter_and_score(slice_pod("c", 300))  # the shipped threshold: 40 rows are too few to group
    assert policy.rows_scored == 40


def test_policies_reading_more_than_the_ledger_rows_are_not_grouped() -> None:
    state = ClusterState([make_node(f"n{i}", 2) for i in range(8)])
    assert not make_policy("clustering").scores_read_ledger_rows()  # reads the placements' shapes
    assert not make_policy("random").scores_read_ledger_rows()
    auto = Scheduler(state, make_policy("binpack"))
    assert not auto._grouped(auto.policy)  # binpack's scores cost less than the grouping (measured)
    assert Scheduler(state, make_policy("gpupool"))._grouped(make_policy("gpupool"))


def test_groups_follow_every_input_and_only_changed_rows_are_read() -> None:
    state = ClusterState([make_node(f"n{i}", 2) for i in range(6)] + [make_node("big", 2, cpu=8_000)])
    groups = RowGroups(state)
    rows = np.arange(state.size, dtype=np.int64)
    _, member_of = groups.group(rows, None)
    assert len(set(member_of[:6].tolist())) == 1 and member_of[6] != member_of[0]
    state.set_card_health("n2", 1, False)
    read: list[int] = []
    original = groups.key

    def counted(changed: IntArray) -> IntArray:
        read.extend(changed.tolist())
        return original(changed)

    groups.key = counted  # type: ignore[method-assign,assignment]
    _, member_of = groups.group(rows, None)
    assert read == [state.index["n2"]]
    assert len(set(member_of[:6].tolist())) == 2
    state.set_card_health("n2", 1, True)
    _, member_of = groups.group(rows, None)
    assert len(set(member_of[:6].tolist())) == 1  # the same state again, the same group
    scoped = np.zeros((state.size, state.max_cards), dtype=bool)
    scoped[3] = True  # a scope that admits n3's cards only splits n3 off
    _, member_of = groups.group(rows, scoped)
    assert len(set(member_of[:6].tolist())) == 2 and member_of[3] not in member_of[[0, 1, 2, 4, 5]]


def test_a_hash_shared_by_unequal_rows_does_not_join_them() -> None:
    state = ClusterState([make_node(f"n{i}", 2, cpu=16_000 + 1_000 * (i % 2)) for i in range(6)])
    groups = RowGroups(state)
    width = groups.key(np.arange(1, dtype=np.int64)).shape[1]
    groups._weights = np.zeros(width, dtype=np.int64)  # every row hashes to 0
    first, member_of = groups.group(np.arange(state.size, dtype=np.int64), None)
    assert member_of[0::2].tolist() == [member_of[0]] * 3 and member_of[1::2].tolist() == [member_of[1]] * 3
    assert member_of[0] != member_of[1] and len(first) == 2


@pytest.mark.parametrize("policy", ["gpupool", "binpack"])
def test_nodes_alike_but_for_their_topology_are_scored_apart(policy: str) -> None:
    """The topology is no ledger array: a node that publishes one is never grouped with another."""
    specs = [make_node(f"n{i}", 4, topology=Topology.from_tree([[0, 1], [2, 3]], 4) if i % 2 else None)
             for i in range(12)]
    ledgers = [ClusterState(specs), ClusterState(specs)]
    profile = WorkloadProfile.from_pods([slice_pod("t", 500)])
    per_node = schedulers(ledgers[0], policy, profile)["never"]
    grouped = schedulers(ledgers[1], policy, profile)["always"]
    pod = slice_pod("two", 1_000, count=2)
    with group_every_call():
        expected, got = per_node.filter_and_score(pod), grouped.filter_and_score(pod)
    np.testing.assert_array_equal(expected[0], got[0])
    np.testing.assert_array_equal(expected[1], got[1])
    assert len(set(got[1].tolist())) == 2  # the linked nodes score above the flat ones


def test_a_policy_scoring_the_pods_memory_scores_pods_of_other_memory_apart() -> None:
    """``dra-allocator`` replays kube-scheduler's LeastAllocated, which reads the pod's memory: the
    scores kept per CPU and GPU request were handed to a pod that differed in memory alone. Here a
    1 GiB pod prefers n0 (more CPU free) and a 14 GB pod n1 (n0 has 16 GB of memory)."""
    state = ClusterState([make_node("n0", 2, cpu=64_000, memory=16_000), make_node("n1", 2, cpu=32_000)])
    scheduler = Scheduler(state, make_policy("dra-allocator"))
    small = slice_pod("small", 200, cpu=8_000, memory=1_024)
    large = slice_pod("large", 200, cpu=8_000, memory=14_000)
    rows, scores = scheduler.filter_and_score(small)
    assert state.node_names([rows[int(np.argmax(scores))]]) == ["n0"]
    rows, scores = scheduler.filter_and_score(large)
    assert state.node_names([rows[int(np.argmax(scores))]]) == ["n1"]
    fresh_rows, fresh_scores = Scheduler(state, make_policy("dra-allocator")).filter_and_score(large)
    assert list(rows) == list(fresh_rows) and np.allclose(scores, fresh_scores)
