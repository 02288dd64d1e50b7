"""Where a remote share is booked: the pod's own node, a GPU node behind its switch, then any other;
the ledger books and releases it like any placement (gpupool/core/remote_share.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpupool.core.cards import assign_on_node
from gpupool.core.model import ContainerRequest, GpuRequest, NodeSpec, PodRequest, VirtualCards
from gpupool.core.policies import make_policy
from gpupool.core.remote_share import (
    NO_SERVER,
    SWITCH_LABEL,
    ZONE_LABEL,
    RemoteChoice,
    Tier,
    client_problem,
    client_scores,
    place_share,
    remote_shape_problem,
    share_alone,
)
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import ClusterState
from tests.core.builders import book_slice, make_node


def labelled(spec: NodeSpec, **labels: str) -> NodeSpec:
    return dataclasses.replace(spec, labels={**spec.labels, **labels})


def on_switch(spec: NodeSpec, switch: str) -> NodeSpec:
    return labelled(spec, **{SWITCH_LABEL: switch})


def remote_pod(key: str = "ns/p", mib: int = 4_000, *, cpu: int = 1_000, cards: int = 1) -> PodRequest:
    return PodRequest(key=key, remote=True,
                      containers=(ContainerRequest("main", cpu_milli=cpu, memory_mib=512,
                                                   gpu=GpuRequest(count=cards, memory_mib=mib, compute=300)),))


def cpu_node(name: str, switch: str | None = None, *, cpu: int = 64_000) -> NodeSpec:
    spec = make_node(name, 0, cpu=cpu)
    return on_switch(spec, switch) if switch else spec


def gpu_node(name: str, switch: str | None = None, cards: int | list[int] = 1) -> NodeSpec:
    spec = make_node(name, cards)
    return on_switch(spec, switch) if switch else spec


def choose(state: ClusterState, pod: PodRequest, client: str) -> RemoteChoice:
    choice = place_share(state, pod, state.index[client])
    assert isinstance(choice, RemoteChoice), choice
    return choice


def test_the_own_node_with_a_fitting_card_gets_a_plain_local_share() -> None:
    state = ClusterState([gpu_node("own", "s1"), gpu_node("near", "s1")])
    choice = choose(state, remote_pod(), "own")
    assert choice.tier is Tier.LOCAL
    assert choice.placement.node == "own"
    assert choice.placement.cpu_milli == 1_000  # a local share holds the pod's CPU there as usual


def test_a_node_without_gpus_gets_a_share_behind_its_own_switch_before_any_other() -> None:
    # "far" is listed first and is the tighter fit: only the switch puts "near" first
    state = ClusterState([gpu_node("far", "s2", [8_000]), gpu_node("near", "s1"), cpu_node("cpu", "s1")])
    choice = choose(state, remote_pod(), "cpu")
    assert (choice.tier, choice.placement.node) == (Tier.SAME_SWITCH, "near")
    assert (choice.placement.cpu_milli, choice.placement.memory_mib) == (0, 0)  # the slice alone
    [container] = choice.placement.containers
    assert [(s.card, s.memory_mib, s.compute) for s in container.slices] == [(0, 4_000, 300)]


def test_without_a_fitting_card_behind_its_switch_any_other_gpu_node_serves() -> None:
    state = ClusterState([gpu_node("near", "s1", [2_000]), gpu_node("far", "s2"), cpu_node("cpu", "s1")])
    choice = choose(state, remote_pod(), "cpu")
    assert (choice.tier, choice.placement.node) == (Tier.OTHER, "far")


def test_the_zone_label_stands_in_for_a_missing_switch_label() -> None:
    zone = {ZONE_LABEL: "z1"}
    state = ClusterState([gpu_node("far"), labelled(gpu_node("near"), **zone), labelled(cpu_node("cpu"), **zone)])
    assert choose(state, remote_pod(), "cpu").placement.node == "near"


def test_within_a_tier_the_tightest_card_wins_by_the_card_rule() -> None:
    # "roomy" has a whole free card; "tight" has a card with just enough memory left
    state = ClusterState([gpu_node("roomy", "s1"), gpu_node("tight", "s1"), cpu_node("cpu", "s1")])
    book_slice(state, "other/holder", "tight", 0, memory=12_000, compute=100)
    choice = choose(state, remote_pod(mib=4_000), "cpu")
    assert choice.placement.node == "tight"
    book_slice(state, "other/second", "tight", 0, memory=1_000)  # 3,384 MiB left: too little now
    assert choose(state, remote_pod(mib=4_000), "cpu").placement.node == "roomy"


def test_a_node_without_switch_labels_shares_a_switch_with_no_one() -> None:
    state = ClusterState([gpu_node("a"), cpu_node("cpu")])
    assert choose(state, remote_pod(), "cpu").tier is Tier.OTHER


def test_a_gpu_node_whose_cards_cannot_hold_the_share_may_not_run_the_pod() -> None:
    """Its kubelet would ask its device plugin for the pod's gpupool resources."""
    state = ClusterState([gpu_node("small", "s1", [2_000]), gpu_node("big", "s1"), cpu_node("cpu", "s1")])
    problem = client_problem(state, remote_pod(), state.index["small"])
    assert problem is not None and "runs a remote-share pod only on its own cards" in problem
    rows, _ = client_scores(state, remote_pod(), np.arange(state.size))
    assert sorted(state.specs[int(r)].name for r in rows) == ["big", "cpu"]


def test_no_gpu_node_with_room_refuses_every_node_with_the_reason() -> None:
    state = ClusterState([gpu_node("g", "s1", [2_000]), cpu_node("cpu", "s1")])
    assert place_share(state, remote_pod(), state.index["cpu"]) == NO_SERVER
    rows, _ = client_scores(state, remote_pod(), np.arange(state.size))
    assert not len(rows)


def test_the_pods_own_node_needs_room_for_its_cpu() -> None:
    state = ClusterState([gpu_node("g"), cpu_node("cpu", cpu=500)])
    problem = place_share(state, remote_pod(cpu=1_000), state.index["cpu"])
    assert isinstance(problem, str) and "insufficient CPU" in problem


def test_filter_scores_follow_the_tiers() -> None:
    state = ClusterState([gpu_node("own", "s1"), cpu_node("near", "s1"), cpu_node("far", "s2")])
    rows, scores = client_scores(state, remote_pod(), np.arange(state.size))
    by_name = {state.specs[int(r)].name: float(s) for r, s in zip(rows, scores, strict=True)}
    assert by_name == {"own": 2.0, "near": 1.0, "far": 0.0}


@pytest.mark.parametrize(("pod", "words"), [
    (PodRequest(key="ns/p", remote=True, containers=(
        ContainerRequest("a", gpu=GpuRequest(memory_mib=1)), ContainerRequest("b", gpu=GpuRequest(memory_mib=1)))),
     "2 containers ask for GPUs"),
    (PodRequest(key="ns/p", remote=True, containers=(ContainerRequest("a", gpu=GpuRequest(count=17, memory_mib=1)),)),
     "1 to 16 cards of one GPU node; container a asks for 17"),
    (PodRequest(key="ns/p", remote=True, containers=(ContainerRequest("a", gpu=GpuRequest(
        count=2, memory_mib=1, virtual=VirtualCards.SHARED)),)),
     "has no virtual cards"),
    (PodRequest(key="ns/p", remote=True, containers=(ContainerRequest("a", gpu=GpuRequest(memory_mib=1)),),
                init_containers=(ContainerRequest("i", gpu=GpuRequest(memory_mib=1)),)),
     "init container"),
])
def test_only_one_app_container_on_at_most_16_real_cards_can_be_remote(pod: PodRequest, words: str) -> None:
    problem = remote_shape_problem(pod)
    assert problem is not None and words in problem


def test_the_ledger_books_the_share_on_the_server_card_and_releases_it_with_the_pod() -> None:
    state = ClusterState([gpu_node("g", "s1"), cpu_node("cpu", "s1")])
    choice = choose(state, remote_pod(), "cpu")
    state.apply(choice.placement)
    [card] = state.card_usage("g")
    assert (card.memory_free, card.compute_free) == (16_384 - 4_000, 700)
    assert int(state.cpu_free[state.index["g"]]) == 64_000  # the pod's CPU is not on the server
    state.release("ns/p")
    [card] = state.card_usage("g")
    assert (card.memory_free, card.compute_free) == (16_384, 1_000)


def test_a_server_node_that_leaves_takes_the_booking_with_it() -> None:
    state = ClusterState([gpu_node("g", "s1"), cpu_node("cpu", "s1")])
    state.apply(choose(state, remote_pod(), "cpu").placement)
    dropped = state.remove_node("g")
    assert [p.pod_key for p in dropped] == ["ns/p"] and "ns/p" not in state.placements


def test_the_scheduler_decides_and_assigns_remote_shares() -> None:
    state = ClusterState([gpu_node("g", "s1", [8_000]), cpu_node("cpu", "s1")])
    scheduler = Scheduler(state, make_policy("binpack"))
    assigned = scheduler.assign(remote_pod(), "cpu")
    assert not isinstance(assigned, Unschedulable) and assigned.node == "g"
    decided = scheduler.schedule(remote_pod("ns/first", mib=6_000))
    assert not isinstance(decided, Unschedulable)
    assert decided.node == "g" and decided.cpu_milli == 1_000  # g itself scores best: a local share
    refused = scheduler.assign(remote_pod("ns/second", mib=6_000), "cpu")
    assert isinstance(refused, Unschedulable) and refused.reason == NO_SERVER
    explained = scheduler.explain(remote_pod("ns/second", mib=6_000), np.arange(state.size))
    assert explained["cpu"] == NO_SERVER
    assert "runs a remote-share pod only on its own cards" in explained["g"]


def test_a_compute_only_share_cannot_be_remote() -> None:
    """The server books memory per client (the clients file's memory_mib is at least 1)."""
    pod = PodRequest(key="ns/p", remote=True, containers=(ContainerRequest("a", gpu=GpuRequest(compute=300)),))
    problem = remote_shape_problem(pod)
    assert problem is not None and "needs GPU memory" in problem
    proportional = PodRequest(key="ns/p", remote=True,
                              containers=(ContainerRequest("a", gpu=GpuRequest.fraction(300)),))
    assert remote_shape_problem(proportional) is None


# ------------------------------------------------------------------ several cards of one GPU node
def test_a_share_of_two_cards_is_booked_on_two_cards_of_one_node_as_a_local_pod_would_be() -> None:
    """gpu-shared: 2 remote: two distinct cards of one server, chosen by the core's card choice (the
    same cards assign_on_node gives the pod's GPU container as a local pod of that node)."""
    state = ClusterState([gpu_node("g", "s1", [16_000, 8_000, 16_000, 6_000]), cpu_node("cpu", "s1")])
    book_slice(state, "other", "g", 2, memory=10_000)
    choice = choose(state, remote_pod(cards=2), "cpu")
    assert choice.tier == Tier.SAME_SWITCH and choice.placement.node == "g"
    [container] = choice.placement.containers
    cards = [s.card for s in container.slices]
    assert len(set(cards)) == 2
    local = assign_on_node(state, state.index["g"], share_alone(remote_pod(cards=2)))
    assert not isinstance(local, str)
    assert cards == [s.card for s in local.containers[0].slices]
    before = [c.memory_free for c in state.card_usage("g")]
    state.apply(choice.placement)
    after = [c.memory_free for c in state.card_usage("g")]
    assert {i for i, free in enumerate(before) if after[i] != free} == set(cards)


def test_two_cards_go_to_a_node_behind_the_switch_before_one_elsewhere_and_never_across_nodes() -> None:
    state = ClusterState([gpu_node("far", "s2", 2), gpu_node("near-one", "s1", 1), gpu_node("near-two", "s1", 2),
                          cpu_node("cpu", "s1")])
    choice = choose(state, remote_pod(cards=2), "cpu")
    assert (choice.placement.node, choice.tier) == ("near-two", Tier.SAME_SWITCH)
    state = ClusterState([gpu_node("far", "s2", 2), gpu_node("near-a", "s1", 1), gpu_node("near-b", "s1", 1),
                          cpu_node("cpu", "s1")])
    choice = choose(state, remote_pod(cards=2), "cpu")  # two one-card nodes behind the switch are not combined
    assert (choice.placement.node, choice.tier) == ("far", Tier.OTHER)


def test_no_node_with_two_cards_with_room_is_unschedulable_with_the_reason() -> None:
    state = ClusterState([gpu_node("g", "s1", 2), gpu_node("h", "s1", 2), cpu_node("cpu", "s1")])
    book_slice(state, "ns/g", "g", 0, memory=14_000)
    book_slice(state, "ns/h", "h", 1, memory=14_000)
    refused = place_share(state, remote_pod(cards=2), state.index["cpu"])
    assert refused == ("no GPU node of the cluster has 2 cards that can each hold a slice of the remote share now "
                       "(a remote share's cards are all on one GPU node)")
    scheduler = Scheduler(state, make_policy("binpack"))
    explained = scheduler.explain(remote_pod(cards=2), np.arange(state.size))
    assert explained["cpu"] == refused


def test_more_cards_than_the_largest_gpu_node_has_is_refused_saying_so() -> None:
    state = ClusterState([gpu_node("g", "s1", 2), gpu_node("h", "s2", 3), cpu_node("cpu", "s1")])
    problem = client_problem(state, remote_pod(cards=4), state.index["cpu"])
    assert problem == ("a remote share of 4 cards needs one GPU node with that many; the largest GPU node of the "
                       "cluster has 3")
    assert choose(state, remote_pod(cards=3), "cpu").placement.node == "h"


def test_the_scheduler_assigns_a_two_card_remote_share_and_books_both_cards() -> None:
    state = ClusterState([gpu_node("g", "s1", 2), cpu_node("cpu", "s1")])
    scheduler = Scheduler(state, make_policy("binpack"))
    assigned = scheduler.assign(remote_pod(cards=2), "cpu")
    assert not isinstance(assigned, Unschedulable) and assigned.node == "g"
    state.apply(assigned)
    assert sorted(c.memory_free for c in state.card_usage("g")) == [16_384 - 4_000] * 2


def test_the_pods_own_node_with_two_cards_with_room_gets_a_plain_local_share_of_two() -> None:
    state = ClusterState([gpu_node("own", "s1", 2), gpu_node("near", "s1", 2)])
    choice = choose(state, remote_pod(cards=2), "own")
    assert (choice.placement.node, choice.tier) == ("own", Tier.LOCAL)
    assert sorted(s.card for s in choice.placement.containers[0].slices) == [0, 1]
    assert choice.placement.cpu_milli == 1_000  # a local share: the pod's CPU on its node too
