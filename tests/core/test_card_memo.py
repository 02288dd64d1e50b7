"""The fragmentation policies' card chooser reuses the per-card scores of the node scoring, and only
while they are current."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.cards import NodeScratch
from gpupool.core.fragmentation import TypicalPod, WorkloadProfile
from gpupool.core.model import GpuRequest, Placement
from gpupool.core.policies import make_policy
from gpupool.core.policies.card_memo import CardScoreMemo
from gpupool.core.policies.fgd import FragmentationPolicy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from tests.core.builders import book_slice, make_node, slice_pod

PROFILE = WorkloadProfile((
    TypicalPod(cpu_milli=1_000, milli=500, count=1, models=frozenset(), freq=0.5),
    TypicalPod(cpu_milli=2_000, milli=300, count=1, models=frozenset(), freq=0.3),
    TypicalPod(cpu_milli=4_000, milli=1000, count=1, models=frozenset(), freq=0.2),
))
KEY = (1_000, GpuRequest.fraction(300))
ROWS = np.array([0, 1], dtype=np.int64)
SCORES = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
FITS = np.array([[True, True, False, True], [True, True, True, True]])


def ledger() -> ClusterState:
    return ClusterState([make_node(f"n{i}", 4) for i in range(3)], max_cards=4)


def test_scores_are_remembered_at_the_node_version() -> None:
    state, memo = ledger(), CardScoreMemo()
    memo.store(state, KEY, ROWS, SCORES, FITS)
    remembered = memo.lookup(state, KEY, 1, np.ones(4, dtype=bool))
    assert remembered is not None
    assert remembered.tolist() == SCORES[1].tolist()


@pytest.mark.parametrize("change", [
    pytest.param("booking", id="the-node-was-booked-since"),
    pytest.param("other-shape", id="another-shape"),
    pytest.param("other-ledger", id="another-ledger"),
    pytest.param("unscored-card", id="a-card-that-did-not-fit-then"),
    pytest.param("unscored-row", id="a-node-never-scored"),
])
def test_scores_that_are_not_current_are_not_used(change: str) -> None:
    state, memo = ledger(), CardScoreMemo()
    memo.store(state, KEY, ROWS, SCORES, FITS)
    key, row, mask = KEY, 0, np.array([True, True, False, False])
    assert memo.lookup(state, key, row, mask) is not None
    if change == "booking":
        book_slice(state, "p", "n0", 3, compute=100)
    elif change == "other-shape":
        key = (2_000, KEY[1])
    elif change == "other-ledger":
        state = ledger()
    elif change == "unscored-card":
        mask = np.array([False, False, True, False])
    else:
        row = 2
    assert memo.lookup(state, key, row, mask) is None


def test_the_least_recently_scored_shape_is_forgotten() -> None:
    state, memo = ledger(), CardScoreMemo(capacity=2)
    keys = [(cpu, KEY[1]) for cpu in (1, 2, 3)]
    for key in keys:
        memo.store(state, key, ROWS, SCORES, FITS)
    assert memo.lookup(state, keys[0], 1, FITS[1]) is None
    assert memo.lookup(state, keys[2], 1, FITS[1]) is not None


@pytest.mark.parametrize("name", ["fgd", "gpupool"])
def test_the_chooser_picks_the_same_card_with_and_without_remembered_scores(name: str) -> None:
    """Random ledgers: the card chosen after scoring the nodes is the one a fresh policy's chooser
    (nothing remembered) picks on the same node."""
    rng = np.random.default_rng(3)
    for trial in range(30):
        state = ClusterState([make_node(f"n{i}", 4, cpu=16_000) for i in range(4)])
        for i in range(12):
            node, card = f"n{rng.integers(4)}", int(rng.integers(4))
            compute = int(rng.choice([100, 200, 300, 450]))
            if state.card_compute_free[state.index[node], card] >= compute:
                book_slice(state, f"b{i}", node, card, compute=compute, memory=16 * compute)
        pod = slice_pod(f"p{trial}", int(rng.choice([150, 300, 500])))
        scheduler = Scheduler(state, make_policy(name), profile=PROFILE)
        decision = scheduler.decide(pod)
        assert isinstance(decision, Placement)
        policy = scheduler.policy
        assert isinstance(policy, FragmentationPolicy)
        row = state.index[decision.node]
        request = pod.containers[0].gpu
        assert request is not None
        scratch = NodeScratch.of(state, row)
        mask = scratch.fits(state, request)
        assert policy.card_memo.lookup(state, (pod.cpu_milli, request), row, mask) is not None
        fresh = make_policy(name)
        fresh.prepare(state, PROFILE)
        chosen = fresh.shared_chooser()(state, scratch, request, mask, pod.cpu_milli)
        assert decision.containers[0].slices[0].card == chosen
