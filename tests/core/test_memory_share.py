"""Memory as a share of the chosen card (HAMi's gpumem-percentage and its whole-card default)."""

from __future__ import annotations

import pytest

from gpupool.core.model import ContainerRequest, GpuCard, GpuRequest, NodeSpec, Placement, PodRequest
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import ClusterState

SMALL, BIG = GpuCard(0, "GPU-s", "T4", 16_276), GpuCard(1, "GPU-b", "A100", 81_920)


def pod(key: str, request: GpuRequest) -> PodRequest:
    return PodRequest(key=key, containers=(ContainerRequest("main", 100, 100, request),))


@pytest.mark.parametrize(("share", "card", "memory"), [
    pytest.param(250, SMALL, 4069, id="quarter-of-16276-floored"),
    pytest.param(250, BIG, 20_480, id="quarter-of-80-gib"),
    pytest.param(1000, SMALL, 16_276, id="the-whole-memory"),
])
def test_a_share_takes_that_part_of_whichever_card(share: int, card: GpuCard, memory: int) -> None:
    assert GpuRequest(memory_mib=0, memory_share=share).memory_on(card) == memory


@pytest.mark.parametrize("bad", [
    pytest.param({"memory_share": 0}, id="zero"),
    pytest.param({"memory_share": 1001}, id="more-than-the-card"),
    pytest.param({"memory_share": 500, "memory_mib": 1000}, id="with-mib-too"),
])
def test_a_share_is_a_part_of_one_card_and_the_only_memory_figure(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="memory share"):
        GpuRequest(**{"memory_mib": 0, **bad})


def test_four_quarter_shares_fill_a_card_and_a_fifth_is_refused() -> None:
    """The ledger books the floored share on the chosen card, so four quarters fit exactly."""
    state = ClusterState([NodeSpec("n1", 32_000, 64_000, (SMALL,))])
    scheduler = Scheduler(state, make_policy("binpack"))
    quarter = GpuRequest(compute=100, memory_mib=0, memory_share=250)
    for i in range(4):
        assert isinstance(scheduler.schedule(pod(f"p{i}", quarter)), Placement)
    assert int(state.card_mem_free[0, 0]) == 16_276 - 4 * 4069
    assert isinstance(scheduler.schedule(pod("p4", quarter)), Unschedulable)


def test_cores_alone_with_the_whole_memory_keep_others_off_the_card() -> None:
    state = ClusterState([NodeSpec("n1", 32_000, 64_000, (SMALL,))])
    scheduler = Scheduler(state, make_policy("binpack"))
    placed = scheduler.schedule(pod("a", GpuRequest(compute=300, memory_mib=0, memory_share=1000)))
    assert isinstance(placed, Placement) and placed.containers[0].slices[0].memory_mib == 16_276
    assert isinstance(scheduler.schedule(pod("b", GpuRequest(compute=100, memory_mib=1000))), Unschedulable)
