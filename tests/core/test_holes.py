"""Dead holes: the table, the per-card charge, and the choices it changes in gpupool."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.fragmentation import TypicalPod, WorkloadProfile
from gpupool.core.holes import DEAD_SHARE, dead_compute_change, dead_hole_table
from gpupool.core.model import Placement
from gpupool.core.policies import make_policy
from gpupool.core.policies.gpupool_policy import GpupoolPolicy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from tests.core.builders import book_slice, make_node, slice_pod


def typical(milli: int, freq: float, count: int = 1) -> TypicalPod:
    return TypicalPod(cpu_milli=1_000, milli=milli, count=count, models=frozenset(), freq=freq)


# A trace-like workload: half whole cards, slices of 810/470/320/650, and 160-milli slices rare
# enough (0.01 / 0.5 = 2 % of the slices) that a hole only they fit (under 320) counts as dead.
PROFILE = WorkloadProfile((typical(1000, 0.5), typical(810, 0.15), typical(470, 0.16), typical(320, 0.1),
                           typical(650, 0.08), typical(160, 0.01)))


def test_a_hole_is_dead_below_the_smallest_size_that_enough_slices_fit() -> None:
    # slices: 470 (0.5), 320 (0.3), 160 (0.02), 0.82 in all; whole cards and CPU-only pods are no slices
    profile = WorkloadProfile((typical(470, 0.5), typical(320, 0.3), typical(160, 0.02),
                               typical(1000, 0.1), typical(1000, 0.05, count=2), typical(0, 0.03, count=0)))
    table = dead_hole_table(profile)
    assert 0.02 / 0.82 < DEAD_SHARE < 0.32 / 0.82
    assert table[[0, 1, 100, 159, 160, 210, 319]].tolist() == [0, 1, 100, 159, 160, 210, 319]
    assert table[[320, 469, 470, 999, 1000]].tolist() == [0, 0, 0, 0, 0]
    # with a higher bar the 320 step is not enough either (0.32/0.82 = 39 % of slices fit)
    assert dead_hole_table(profile, share=0.5)[[320, 469, 470]].tolist() == [320, 469, 0]


def test_without_slices_nothing_is_dead() -> None:
    assert not dead_hole_table(WorkloadProfile(())).any()
    assert not dead_hole_table(WorkloadProfile((typical(1000, 0.7), typical(1000, 0.3, count=4)))).any()


def test_the_charge_is_the_dead_compute_created_minus_the_dead_compute_filled() -> None:
    table = dead_hole_table(PROFILE)  # dead below 320 (160 fits 2 % of the slices)
    free = np.array([[530, 350, 1000, 680], [190, 0, 250, 320]], dtype=np.int64)
    assert dead_compute_change(table, free, 320)[0].tolist() == [210, 30, 0, 0]
    # a 160 slice into a 190 hole fills 160 of dead compute; into 250 it leaves 90 of the 250 dead
    assert dead_compute_change(table, free, 160)[1].tolist() == [-160, 0, -160, 160]


@pytest.mark.parametrize(("milli", "on_a", "on_b"), [
    # a: 530 free -> 210 dead; b: 680 -> 360, which a 320 still fits
    pytest.param(320, (470,), (320,), id="210-dead-on-a"),
    # a: 350 -> 190 dead; b: fills the 190 an 810 slice left
    pytest.param(160, (650,), (810,), id="fills-the-190-hole"),
])
def test_gpupool_leaves_no_dead_hole_where_the_fragmentation_gain_alone_would(
        milli: int, on_a: tuple[int, ...], on_b: tuple[int, ...]) -> None:
    chosen = {}
    for weight in (0.0, GpupoolPolicy.dead_hole_weight):
        state = ClusterState([make_node("a", 1), make_node("b", 1)])
        for node, slices in (("a", on_a), ("b", on_b)):
            for i, compute in enumerate(slices):
                book_slice(state, f"{node}{i}", node, 0, compute=compute, memory=compute * 16)
        policy = make_policy("gpupool")
        assert isinstance(policy, GpupoolPolicy)
        policy.dead_hole_weight = weight
        decision = Scheduler(state, policy, profile=PROFILE, tie_rank=np.array([0, 1])).decide(
            slice_pod("p", milli))
        assert isinstance(decision, Placement)
        chosen[weight] = decision.node
    assert chosen == {0.0: "a", GpupoolPolicy.dead_hole_weight: "b"}


@pytest.mark.parametrize("policy_name", ["fgd", "gpupool"])
def test_known_answer_two_cards_hold_four_slices_only_without_dead_holes(policy_name: str) -> None:
    """470, 320, 470, 650 arrive at one node of two cards. Pairing 470+470 (60 left) and 320+650
    (30 left) places all four; putting the 320 beside the first 470 leaves 210 that nothing of the
    four fits, and the 650 fails. FGD does the latter; gpupool the former."""
    state = ClusterState([make_node("n", 2)])
    scheduler = Scheduler(state, make_policy(policy_name), profile=PROFILE, tie_rank=np.array([0]))
    decisions = [scheduler.schedule(slice_pod(f"p{i}", m)) for i, m in enumerate((470, 320, 470, 650))]
    placed = [d for d in decisions if isinstance(d, Placement)]
    if policy_name == "fgd":
        assert len(placed) == 3 and not isinstance(decisions[3], Placement)
    else:
        assert len(placed) == 4
        cards = [d.containers[0].slices[0].card for d in placed]
        assert cards[0] == cards[2] and cards[1] == cards[3] and cards[0] != cards[1]
