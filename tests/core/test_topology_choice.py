"""Topology reaches the choice of the node: a multi-card pod goes where its cards are best connected.

Two nodes the policy scores equal (same cards, same bookings, same CPU) differ only in how their
free cards are linked; every policy must prefer the node that can give a same-switch or NVLink set
over one that can only give cards across sockets, whatever the node order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import GpuRequest, LinkLevel, NodeSpec, Placement, Topology
from gpupool.core.policies import POLICIES, make_policy
from gpupool.core.policies.topology import TOPOLOGY_WEIGHT, topology_rise, worst_cost
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from tests.core.builders import book_whole, make_node, pod_with, rows, slice_pod

TREE = Topology.from_tree([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], 8)
"""Two sockets, two PCIe switches each, two cards per switch."""


def nvlink_pair(cards: int) -> Topology:
    """Cards 0 and 1 joined by NVLink; every other pair across sockets."""
    levels = [[LinkLevel.SELF if i == j else LinkLevel.SYSTEM for j in range(cards)] for i in range(cards)]
    levels[0][1] = levels[1][0] = LinkLevel.NVLINK
    return Topology(tuple(tuple(row) for row in levels))


@dataclass(frozen=True)
class Case:
    """Two nodes of the same cards: ``good`` keeps ``good_free`` idle, ``poor`` keeps ``poor_free``."""

    cards: int
    good_topology: Topology
    poor_topology: Topology | None
    good_free: frozenset[int]
    poor_free: frozenset[int]
    count: int

    def cluster(self, good_first: bool) -> ClusterState:
        good = make_node("good", self.cards, topology=self.good_topology)
        poor = make_node("poor", self.cards, topology=self.poor_topology)
        nodes: list[NodeSpec] = [good, poor] if good_first else [poor, good]
        state = ClusterState(nodes)
        for spec, free in ((good, self.good_free), (poor, self.poor_free)):
            for card in range(self.cards):
                if card not in free:
                    book_whole(state, f"{spec.name}-held-{card}", spec.name, card)
        return state


CASES = [
    pytest.param(Case(8, TREE, TREE, frozenset({0, 1}), frozenset({0, 4}), 2), id="same-switch-vs-cross-socket"),
    pytest.param(Case(4, nvlink_pair(4), None, frozenset({0, 1}), frozenset({0, 1}), 2),
                 id="nvlink-vs-no-topology"),
    pytest.param(Case(8, TREE, TREE, frozenset({0, 1, 2, 3}), frozenset({0, 1, 4, 5}), 4),
                 id="one-socket-vs-split-four-cards"),
]
POLICY_NAMES = [pytest.param(name, id=name) for name in sorted(POLICIES) if name != "random"]
"""Random scores nodes by a draw, so no two nodes are "otherwise equal" under it."""

PROFILE = WorkloadProfile.from_pods([slice_pod("a", 500), slice_pod("b", 1000), slice_pod("c", 1000, count=2)])


def scheduler(state: ClusterState, policy: str, ranks: list[int]) -> Scheduler:
    return Scheduler(state, make_policy(policy), profile=PROFILE, tie_rank=np.asarray(ranks, dtype=np.int64))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_the_better_connected_node_scores_higher(case: Case, policy: str) -> None:
    state = case.cluster(good_first=False)
    ok, scores = scheduler(state, policy, [0, 1]).filter_and_score(pod_with("p", GpuRequest.whole(case.count)))
    by_name = dict(zip(state.node_names(ok), scores.tolist(), strict=True))
    assert by_name["good"] > by_name["poor"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("good_first", [pytest.param(True, id="good-listed-first"),
                                        pytest.param(False, id="poor-listed-first")])
@pytest.mark.parametrize("ranks", [pytest.param([0, 1], id="first-row-wins-ties"),
                                   pytest.param([1, 0], id="second-row-wins-ties")])
def test_the_choice_does_not_depend_on_node_order(case: Case, policy: str, good_first: bool,
                                                  ranks: list[int]) -> None:
    state = case.cluster(good_first)
    decision = scheduler(state, policy, ranks).decide(pod_with("p", GpuRequest.whole(case.count)))
    assert isinstance(decision, Placement)
    assert decision.node == "good"
    assert set(decision.containers[0].cards) == case.good_free


@pytest.mark.parametrize("policy", [pytest.param("binpack", id="binpack"), pytest.param("gpupool", id="gpupool")])
def test_topology_does_not_overturn_a_policy_difference(policy: str) -> None:
    """binpack prefers the node with fewer idle cards; gpupool the node that keeps a whole node
    free for 2-card pods: a better link does not outweigh either."""
    case = Case(8, TREE, TREE, frozenset({0, 1, 2}), frozenset({0, 4}), 2)
    state = case.cluster(good_first=True)
    decision = scheduler(state, policy, [0, 1]).decide(pod_with("p", GpuRequest.whole(2)))
    assert isinstance(decision, Placement) and decision.node == "poor"


@pytest.mark.parametrize(("topology", "count", "expected"), [
    pytest.param(None, 2, 0.0, id="no-topology"),
    pytest.param(Topology.flat(4), 2, 0.0, id="flat"),
    pytest.param(TREE, 1, 0.0, id="single-card"),
    pytest.param(TREE, 2, TOPOLOGY_WEIGHT * (6 - 2) / 6, id="same-switch-pair"),
    pytest.param(nvlink_pair(4), 2, TOPOLOGY_WEIGHT * (6 - 1) / 6, id="nvlink-pair"),
])
def test_topology_rise(topology: Topology | None, count: int, expected: float) -> None:
    cards = 8 if topology is TREE else 4
    state = ClusterState([make_node("n", cards, topology=topology)])
    fits = np.zeros((1, state.max_cards), dtype=bool)
    fits[0, :cards] = True
    assert topology_rise(state, count, rows(0), fits).tolist() == pytest.approx([expected])


def test_the_rise_stays_below_one_step_of_the_scores() -> None:
    assert worst_cost(8) == int(LinkLevel.SYSTEM) * 28
    assert TOPOLOGY_WEIGHT < 1.0
