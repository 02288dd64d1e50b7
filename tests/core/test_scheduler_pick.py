"""The scheduler's shortcut for the best node agrees with its full order of nodes."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from tests.core.builders import make_node, slice_pod


@pytest.mark.parametrize("scores", [
    pytest.param([3.0, 5.0, 5.0, 1.0, 5.0], id="ties-broken-by-rank"),
    pytest.param([2.0, 2.0, 2.0], id="all-tied"),
    pytest.param([-np.inf, -np.inf, 0.5], id="infinite-scores"),
    pytest.param([-np.inf, -np.inf], id="all-minus-infinity"),
    pytest.param([7.0], id="one-node"),
])
def test_first_is_the_head_of_the_full_order(scores: list[float]) -> None:
    rows = np.arange(10, 10 + len(scores), dtype=np.int64)
    values = np.asarray(scores)
    for seed in range(20):
        secondary = np.random.default_rng(seed).permutation(len(scores)).astype(np.int64)
        assert Scheduler._first(rows, values, secondary) == int(Scheduler._order(rows, values, secondary)[0])


def test_first_with_repeated_tie_ranks_takes_the_earliest_row() -> None:
    rows = np.array([4, 2, 9], dtype=np.int64)
    values = np.array([1.0, 1.0, 1.0])
    secondary = np.array([0, 0, 0], dtype=np.int64)
    assert Scheduler._first(rows, values, secondary) == 4 == int(Scheduler._order(rows, values, secondary)[0])


def test_first_declines_nan_scores() -> None:
    """NaN sorts last in the full order but poisons a max, so the shortcut must step aside."""
    rows = np.arange(3, dtype=np.int64)
    assert Scheduler._first(rows, np.array([1.0, np.nan, 2.0]), np.arange(3, dtype=np.int64)) is None


def test_random_ties_draw_once_per_decision() -> None:
    """Without a tie rank the order is a draw; the shortcut must not draw a second time."""
    state = ClusterState([make_node(f"n{i}", cards=2) for i in range(4)])
    drawn = np.random.default_rng(3)
    scheduler = Scheduler(state, make_policy("binpack"), rng=np.random.default_rng(3))
    scheduler.decide(slice_pod("p", 300))
    drawn.permutation(4)
    assert scheduler.rng.integers(1 << 30) == drawn.integers(1 << 30)
