"""Prioritize's 0..10 scale keeps the policy's choice: the best nodes, and only they, get 10.

kube-scheduler takes a node of the highest total score; when only the extender scores, that is a
node with 10. If a near-best node also got 10, the cluster could choose a node the simulator never
would (bench/fidelity.py measured 33 % same placements for binpack before this rule, 100 % after).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.extender.service import MAX_EXTENDER_PRIORITY, scale_scores


@pytest.mark.parametrize(("raw", "expected"), [
    pytest.param([0.0, 99.0, 100.0], [0, 9, 10], id="near-best-is-not-best"),
    pytest.param([25.0, 26.0, 19.0], [8, 10, 0], id="min-max-rounded-down"),
    pytest.param([3.0, 3.0], [10, 10], id="all-equal-all-best"),
])
def test_only_the_best_nodes_get_the_top_score(raw: list[float], expected: list[int]) -> None:
    names = [f"n{i}" for i in range(len(raw))]
    assert scale_scores(names, np.array(raw), names).scores.tolist() == expected


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=40))
def test_the_top_scored_nodes_are_exactly_the_policys_best(raw: list[float]) -> None:
    names = [f"n{i}" for i in range(len(raw))]
    scores = np.array(raw)
    scaled = scale_scores(names, scores, names).scores
    assert set(np.flatnonzero(scaled == MAX_EXTENDER_PRIORITY)) == set(np.flatnonzero(scores == scores.max()))
    assert scaled.min() >= 0 and scaled.max() == MAX_EXTENDER_PRIORITY
