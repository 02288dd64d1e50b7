"""Virtual cards (seed 003, rules 61-68): a slice of n cards served by one card presented as n devices,
only for a request that opts in, never beyond what the one card holds."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.cards import assign_on_node
from gpupool.core.feasibility import explain_node, shape_problem
from gpupool.core.model import CardMode, CardSlice, GpuRequest, Placement, VirtualCards
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import ClusterState
from tests.core.builders import CARD_MIB, book_slice, book_whole, make_node, mem_pod, pod_with

SHARED, EXCLUSIVE = VirtualCards.SHARED, VirtualCards.EXCLUSIVE


def request(mib: int, *, count: int = 2, compute: int = 0, virtual: VirtualCards | None = SHARED) -> GpuRequest:
    return GpuRequest(count=count, compute=compute, memory_mib=mib, virtual=virtual)


def slices_of(result: Placement | str) -> tuple[CardSlice, ...]:
    assert isinstance(result, Placement), result
    (assignment,) = result.containers
    return assignment.slices


def test_shared_mode_puts_every_slice_on_the_tightest_card_that_holds_them_all() -> None:
    state = ClusterState([make_node("n", 3)])
    book_slice(state, "used", "n", 2, memory=4_096)  # card 2: 12 GiB free, the tightest that fits 8 GiB
    result = assign_on_node(state, 0, pod_with("p", request(4_096, compute=200)))
    assert slices_of(result) == (CardSlice(card=2, memory_mib=8_192, compute=400, devices=2),)
    assert isinstance(result, Placement)
    state.apply(result)
    assert int(state.card_mode[0, 2]) == CardMode.SHARED  # the rest stays open to other slices
    assert int(state.card_mem_free[0, 2]) == CARD_MIB - 4_096 - 8_192
    state.apply(slices_of_pod(state, "q", 2_048, card=2))
    state.release("p")
    assert int(state.card_mem_free[0, 2]) == CARD_MIB - 4_096 - 2_048


def slices_of_pod(state: ClusterState, key: str, mib: int, *, card: int) -> Placement:
    placement = assign_on_node(state, 0, mem_pod(key, mib))
    assert isinstance(placement, Placement) and placement.containers[0].cards == (card,), placement
    return placement


def test_one_card_comes_before_physical_cards_when_both_fit() -> None:
    state = ClusterState([make_node("n", 4)])
    assert [s.card for s in slices_of(assign_on_node(state, 0, pod_with("p", request(2_048))))] == [0]


def test_without_the_opt_in_a_multi_card_slice_takes_as_many_physical_cards() -> None:
    state = ClusterState([make_node("n", 4)])
    found = slices_of(assign_on_node(state, 0, pod_with("p", request(2_048, virtual=None))))
    assert [s.card for s in found] == [0, 1] and all(s.devices == 1 for s in found)


@pytest.mark.parametrize(("mib", "compute"), [
    pytest.param(CARD_MIB // 2 + 1, 0, id="memory-beyond-the-card"),
    pytest.param(1_024, 600, id="compute-beyond-the-card"),
])
def test_a_request_beyond_one_card_falls_back_to_physical_cards(mib: int, compute: int) -> None:
    state = ClusterState([make_node("n", 2)])
    found = slices_of(assign_on_node(state, 0, pod_with("p", request(mib, compute=compute))))
    assert [(s.card, s.devices) for s in found] == [(0, 1), (1, 1)]


def test_exclusive_mode_needs_an_idle_card_and_closes_it() -> None:
    state = ClusterState([make_node("n", 3)])
    book_slice(state, "used", "n", 0, memory=1_024)
    result = assign_on_node(state, 0, pod_with("p", request(2_048, virtual=EXCLUSIVE)))
    assert slices_of(result) == (CardSlice(card=1, memory_mib=CARD_MIB, compute=1_000, exclusive=True,
                                           devices=2),)
    assert isinstance(result, Placement)
    state.apply(result)
    assert int(state.card_mode[0, 1]) == CardMode.EXCLUSIVE
    assert slices_of_pod(state, "q", 1_024, card=0)  # never on the closed card


def test_exclusive_mode_without_an_idle_card_uses_physical_cards() -> None:
    state = ClusterState([make_node("n", 2)])
    for card in (0, 1):
        book_slice(state, f"used-{card}", "n", card, memory=1_024)
    found = slices_of(assign_on_node(state, 0, pod_with("p", request(2_048, virtual=EXCLUSIVE))))
    assert [(s.card, s.devices, s.exclusive) for s in found] == [(0, 1, False), (1, 1, False)]


def test_a_one_card_node_takes_a_two_card_request_only_with_the_opt_in() -> None:
    def scheduler() -> Scheduler:
        return Scheduler(ClusterState([make_node("n", 1)]), make_policy("binpack"))

    virtual = pod_with("p", request(4_096))
    placed = scheduler().schedule(virtual)
    assert isinstance(placed, Placement) and placed.containers[0].slices[0].devices == 2
    assert shape_problem(scheduler().state, virtual) is None
    plain = pod_with("p", request(4_096, virtual=None))
    refused = scheduler().schedule(plain)
    assert isinstance(refused, Unschedulable) and "2 cards" in refused.reason
    assert shape_problem(scheduler().state, plain) is not None


def test_the_filter_and_the_explanation_agree_with_the_card_choice() -> None:
    state = ClusterState([make_node("a", 1), make_node("b", 1)])
    book_whole(state, "held", "a", 0)
    scheduler = Scheduler(state, make_policy("binpack"))
    pod = pod_with("p", request(4_096))
    rows, _ = scheduler.filter_and_score(pod)
    assert [state.specs[int(r)].name for r in rows] == ["b"]
    assert explain_node(state, 0, pod) is not None and explain_node(state, 1, pod) is None
    assert set(scheduler.explain(pod, np.array([0, 1]))) == {"a"}


def test_an_init_container_may_be_virtual_too() -> None:
    from gpupool.core.model import ContainerRequest, PodRequest
    pod = PodRequest(key="p", containers=(ContainerRequest("main"),),
                     init_containers=(ContainerRequest("init", gpu=request(1_024)),))
    result = assign_on_node(ClusterState([make_node("n", 1)]), 0, pod)
    assert isinstance(result, Placement)
    assert [(s.card, s.memory_mib, s.devices) for s in result.containers[0].slices] == [(0, 2_048, 2)]


@pytest.mark.parametrize("bad", [
    pytest.param(dict(count=1, memory_mib=1_024), id="one-card"),
    pytest.param(dict(count=2, exclusive=True, compute=1_000, memory_mib=None), id="whole-cards"),
    pytest.param(dict(count=17, memory_mib=1_024), id="too-many-devices"),
])
def test_the_request_refuses_what_virtual_cards_cannot_serve(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="virtual cards"):
        GpuRequest(virtual=SHARED, **bad)  # type: ignore[arg-type]
