"""A pod's own node and card policy (HAMi's per-pod binpack / spread) on top of the cluster's."""

from __future__ import annotations

import pytest

from gpupool.core.model import ContainerRequest, GpuCard, GpuRequest, NodeSpec, Placement, PodRequest
from gpupool.core.pod_policy import PolicyChoice
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState

CARD_MIB = 16_384


def cluster() -> Scheduler:
    """n-busy holds a 4 GiB slice on card 0 of two; n-idle has two idle cards."""
    nodes = [NodeSpec(name, 32_000, 128_000, tuple(GpuCard(i, f"{name}-{i}", "T4", CARD_MIB) for i in range(2)))
             for name in ("n-busy", "n-idle")]
    state = ClusterState(nodes)
    scheduler = Scheduler(state, make_policy("binpack"))
    first = scheduler.assign(slice_pod("first"), "n-busy")
    assert isinstance(first, Placement)
    state.apply(first)
    return scheduler


def slice_pod(key: str, choice: PolicyChoice | None = None) -> PodRequest:
    return PodRequest(key=key, containers=(ContainerRequest("main", 1000, 1000, GpuRequest(memory_mib=4096)),),
                      policy=choice)


@pytest.mark.parametrize(("choice", "node", "card"), [
    pytest.param(None, "n-busy", 0, id="cluster-binpack"),
    pytest.param(PolicyChoice(node="spread"), "n-idle", None, id="node-spread"),
    pytest.param(PolicyChoice(card="spread"), "n-busy", 1, id="card-spread-on-the-binpacked-node"),
    pytest.param(PolicyChoice(node="binpack", card="binpack"), "n-busy", 0, id="both-binpack"),
])
def test_the_pods_choice_moves_its_node_and_card(choice: PolicyChoice | None, node: str, card: int | None) -> None:
    scheduler = cluster()
    decision = scheduler.decide(slice_pod("p", choice))
    assert isinstance(decision, Placement)
    assert decision.node == node
    if card is not None:
        assert decision.containers[0].cards == (card,)


def test_scores_of_one_shape_are_kept_apart_per_choice() -> None:
    """The shape cache must not hand a spread pod the scores a binpack pod of the same shape got."""
    scheduler = cluster()
    rows, binpack = scheduler.filter_and_score(slice_pod("a"))
    _, spread = scheduler.filter_and_score(slice_pod("b", PolicyChoice(node="spread")))
    names = [scheduler.state.specs[r].name for r in rows]
    assert names[int(binpack.argmax())] == "n-busy" and names[int(spread.argmax())] == "n-idle"
