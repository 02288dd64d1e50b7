"""Alibaba gpushare's worked examples (design note 001) under the ``binpack`` policy.

Cards of 16,276 MiB; pods ask for card memory only (``aliyun.com/gpu-mem``).
"""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.model import Placement
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import ClusterState
from tests.core.builders import book_slice, make_node, mem_pod

ALI = 16_276


def bind_example() -> ClusterState:
    """N1 of the bind example: GPU0..GPU3 have 12,207 / 8,138 / 4,069 / 16,276 MiB free."""
    state = ClusterState([make_node("N1", [ALI] * 4)])
    for card, free in enumerate((12_207, 8_138, 4_069)):
        book_slice(state, f"used-{card}", "N1", card, memory=ALI - free)
    return state


@pytest.mark.parametrize(
    ("gpu_mib", "card"),
    [
        # the example: GPU2 is too small, GPU1 has exactly enough and least left
        pytest.param(8_138, 1, id="alibaba-example"),
        # exactly GPU2's free memory
        pytest.param(4_069, 2, id="exactly-gpu2-free"),
        pytest.param(4_070, 1, id="just-over-gpu2"),
        pytest.param(12_207, 0, id="exactly-gpu0-free"),
        # only the empty card holds it
        pytest.param(12_208, 3, id="only-the-empty-card"),
        pytest.param(1, 2, id="smallest-slice"),
    ],
)
def test_bind_picks_the_card_with_least_free_memory_that_fits(gpu_mib: int, card: int) -> None:
    state = bind_example()
    decision = Scheduler(state, make_policy("binpack")).schedule(mem_pod("p", gpu_mib))
    assert isinstance(decision, Placement)
    (slc,) = decision.containers[0].slices
    assert (slc.card, slc.memory_mib, slc.compute) == (card, gpu_mib, 0)
    assert state.card_usage("N1")[card].memory_free == [12_207, 8_138, 4_069, 16_276][card] - gpu_mib


def test_bind_sequence_fills_cards_in_binpack_order() -> None:
    state = bind_example()
    scheduler = Scheduler(state, make_policy("binpack"))
    cards = []
    for i in range(4):
        decision = scheduler.schedule(mem_pod(f"p{i}", 4_069))
        assert isinstance(decision, Placement)
        cards.append(decision.containers[0].slices[0].card)
    # GPU2 (4069) -> GPU1 (8138, then 4069) twice -> GPU0 (12207)
    assert cards == [2, 1, 1, 0]
    assert [u.memory_free for u in state.card_usage("N1")] == [8_138, 0, 0, ALI]


def test_filter_example_only_n3_can_take_8138() -> None:
    """Three nodes of two cards: N1 has 4,069 left in all, N2 4,069 per card, N3 8,138 on GPU0."""
    state = ClusterState([make_node(n, [ALI, ALI]) for n in ("N1", "N2", "N3")])
    book_slice(state, "a", "N1", 0, memory=ALI)
    book_slice(state, "b", "N1", 1, memory=12_207)
    book_slice(state, "c", "N2", 0, memory=12_207)
    book_slice(state, "d", "N2", 1, memory=12_207)
    book_slice(state, "e", "N3", 0, memory=8_138)
    book_slice(state, "f", "N3", 1, memory=ALI)
    scheduler = Scheduler(state, make_policy("binpack"))
    decision = scheduler.schedule(mem_pod("p", 8_138))
    assert isinstance(decision, Placement)
    assert (decision.node, decision.containers[0].slices[0].card) == ("N3", 0)
    # now nothing of 8,138 fits anywhere
    again = scheduler.decide(mem_pod("q", 8_138))
    assert isinstance(again, Unschedulable)
    assert scheduler.explain(mem_pod("q", 8_138), np.arange(3)) == {
        n: "no single card has 8138 MiB free; largest free 4069 MiB" for n in ("N1", "N2")
    } | {"N3": "no single card has 8138 MiB free; largest free 0 MiB"}


def test_binpack_prefers_the_node_with_the_tightest_card() -> None:
    state = ClusterState([make_node("roomy", [ALI, ALI]), make_node("tight", [ALI, ALI]),
                          make_node("empty", [ALI, ALI])])
    book_slice(state, "a", "roomy", 0, memory=4_000)   # 12,276 free
    book_slice(state, "b", "tight", 1, memory=8_000)   # 8,276 free
    tie_rank = np.array([0, 1, 2], dtype=np.int64)    # ties would go to "roomy"
    decision = Scheduler(state, make_policy("binpack"), tie_rank=tie_rank).schedule(mem_pod("p", 8_138))
    assert isinstance(decision, Placement)
    assert (decision.node, decision.containers[0].slices[0].card) == ("tight", 1)


def test_spread_is_the_opposite_mode() -> None:
    state = ClusterState([make_node("used", [ALI, ALI]), make_node("empty", [ALI, ALI])])
    book_slice(state, "a", "used", 0, memory=4_000, compute=100)
    decision = Scheduler(state, make_policy("spread")).schedule(mem_pod("p", 4_000, compute=100))
    assert isinstance(decision, Placement)
    assert decision.node == "empty"
