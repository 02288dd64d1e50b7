"""Placement policies: each picks the node (and card) it is meant to on small hand-made clusters."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gpupool.core.fragmentation import TypicalPod, WorkloadProfile
from gpupool.core.model import Placement, PodRequest
from gpupool.core.policies import DEFAULT_POLICY, POLICIES, PlacementPolicy, make_policy
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import ClusterState
from tests.core.builders import book_slice, book_whole, cpu_pod, make_node, raw_placement, slice_pod

ALL_NAMES = ("random", "binpack", "spread", "bestfit", "dotprod", "packing", "clustering", "fgd", "gpupool",
             "dra-allocator", "dra-steered")


def cluster(*used: list[int], cards: int = 2, cpu: int = 64_000) -> ClusterState:
    """One node per argument; ``used[i][g]`` is the compute booked on card g (1000: exclusive), with
    memory in proportion, as trace pods take it."""
    state = ClusterState([make_node(f"n{i}", max(cards, len(u)), cpu=cpu) for i, u in enumerate(used)])
    for i, per_card in enumerate(used):
        for card, amount in enumerate(per_card):
            if amount == 1000:
                book_whole(state, f"n{i}-w{card}", f"n{i}", card)
            elif amount:
                book_slice(state, f"n{i}-s{card}", f"n{i}", card, compute=amount,
                           memory=16_384 * amount // 1000)
    return state


def decide(name: str, state: ClusterState, pod: PodRequest, *, prefer: list[int] | None = None,
           profile: WorkloadProfile | None = None, seed: int = 0) -> tuple[str, tuple[int, ...]]:
    """(node, cards of the main container) the policy picks; ``prefer``: node order for ties."""
    tie_rank = None if prefer is None else np.argsort(np.asarray(prefer)).astype(np.int64)
    scheduler = Scheduler(state, make_policy(name, np.random.default_rng(seed)), profile=profile,
                          tie_rank=tie_rank, rng=np.random.default_rng(seed))
    decision = scheduler.decide(pod)
    assert isinstance(decision, Placement), decision
    return decision.node, tuple(s.card for c in decision.containers[:1] for s in c.slices)


def only(*pods: TypicalPod) -> WorkloadProfile:
    return WorkloadProfile(pods)


HALF = TypicalPod(cpu_milli=100, milli=500, count=1, models=frozenset(), freq=1.0)


# ------------------------------------------------------------------------------- the registry


def test_registry_has_every_policy() -> None:
    assert set(POLICIES) == set(ALL_NAMES)
    assert DEFAULT_POLICY == "gpupool"
    for name in ALL_NAMES:
        policy = make_policy(name)
        assert isinstance(policy, PlacementPolicy)
        assert policy.name == name


def test_make_policy_returns_fresh_objects() -> None:
    assert make_policy("fgd") is not make_policy("fgd")


@pytest.mark.parametrize("name", ["", "FGD", "best-fit", "tetris"])
def test_make_policy_rejects_unknown_names(name: str) -> None:
    with pytest.raises(ValueError) as info:
        make_policy(name)
    assert str(info.value) == (f"unknown policy {name!r}; choose one of bestfit, binpack, clustering, "
                               "dotprod, dra-allocator, dra-steered, fgd, gpupool, packing, random, spread")


# ------------------------------------------------------------------------------------- random


def test_random_spreads_over_feasible_nodes_only() -> None:
    state = cluster([0, 0], [0, 0], [1000, 1000])  # n2 has no room for a whole card
    scheduler = Scheduler(state, make_policy("random", np.random.default_rng(7)), rng=np.random.default_rng(7))
    nodes = Counter()
    for i in range(60):
        decision = scheduler.decide(slice_pod(f"p{i}", 1000))
        assert isinstance(decision, Placement)
        nodes[decision.node] += 1
    assert set(nodes) == {"n0", "n1"}
    assert min(nodes.values()) > 10


def test_random_card_choice_covers_every_fitting_card() -> None:
    state = cluster([0, 600, 0], cards=3)
    cards = Counter(decide("random", state, slice_pod("p", 500), seed=s)[1][0] for s in range(40))
    assert set(cards) == {0, 2}  # card 1 has only 400 left


def test_random_is_reproducible_per_seed() -> None:
    state = cluster([0, 0], [0, 0], [0, 0], [0, 0])
    picks = [decide("random", state, slice_pod("p", 300), seed=3) for _ in range(3)]
    assert picks[0] == picks[1] == picks[2]


# ------------------------------------------------------------------------------------ binpack


def test_binpack_slices_go_to_the_tightest_card_in_the_cluster() -> None:
    state = cluster([300, 0], [0, 600], [0, 0])
    assert decide("binpack", state, slice_pod("p", 300), prefer=[0, 2, 1]) == ("n1", (1,))


def test_binpack_whole_cards_fill_started_nodes_first() -> None:
    state = cluster([0, 0, 0, 0], [1000, 0, 0, 0], [300, 1000, 0, 0])
    assert decide("binpack", state, slice_pod("p", 1000), prefer=[0, 1, 2]) == ("n2", (2,))


def test_binpack_cpu_only_pods_fill_the_busiest_cpu() -> None:
    state = cluster([0], [0], [0])
    book_slice(state, "c1", "n1", 0, compute=0, memory=1, cpu=20_000)
    assert decide("binpack", state, cpu_pod("p"), prefer=[0, 2, 1])[0] == "n1"


# ------------------------------------------------------------------------------------- spread


def test_spread_picks_the_node_with_most_free_gpu_and_its_emptiest_card() -> None:
    state = cluster([300, 0], [100, 200], [800, 0, 0], cards=3)
    # free GPU: n0 2700 (3 cards), n1 2700, n2 2200; ties on GPU go to more free CPU
    book_slice(state, "cpu", "n0", 2, compute=0, memory=1, cpu=1_000)
    assert decide("spread", state, slice_pod("p", 100), prefer=[0, 1, 2]) == ("n1", (2,))


# ------------------------------------------------------------------------------------ bestfit


def test_bestfit_picks_the_least_leftover() -> None:
    # n0: 1300 free, n1: 1000 free (the paper's integer score needs 160 milli to tell them apart)
    state = cluster([0, 700], [600, 400])
    assert decide("bestfit", state, slice_pod("p", 300), prefer=[0, 1]) == ("n1", (0,))
    _, scores = Scheduler(state, make_policy("bestfit")).filter_and_score(slice_pod("p", 300))
    assert scores.tolist() == [0, 100]


def test_bestfit_integer_score_ties_follow_the_node_order() -> None:
    # 100 milli of difference is below the paper's integer resolution: a tie, as in its simulator
    state = cluster([0, 700], [400, 400])
    assert decide("bestfit", state, slice_pod("p", 300), prefer=[0, 1])[0] == "n0"
    assert decide("bestfit", state, slice_pod("p", 300), prefer=[1, 0])[0] == "n1"


def test_bestfit_counts_cpu_too() -> None:
    state = cluster([0, 0], [0, 0], cpu=64_000)
    book_slice(state, "c", "n1", 0, compute=0, memory=1, cpu=32_000)
    assert decide("bestfit", state, slice_pod("p", 1000), prefer=[0, 1])[0] == "n1"


def test_bestfit_normalises_scores_min_max() -> None:
    state = cluster([0, 0], [0, 500], [500, 500])
    scheduler = Scheduler(state, make_policy("bestfit"))
    rows, scores = scheduler.filter_and_score(slice_pod("p", 300))
    assert rows.tolist() == [0, 1, 2]
    assert scores[0] == 0 and scores[2] == 100
    assert 0 < scores[1] < 100


# ------------------------------------------------------------------------------------ dotprod


def test_dotprod_prefers_the_smaller_dot_product() -> None:
    state = cluster([0] * 8, [1000] * 4 + [0] * 4, cards=8)
    assert decide("dotprod", state, slice_pod("p", 1000, count=4), prefer=[0, 1]) == ("n1", (4, 5, 6, 7))


def test_dotprod_scores_follow_the_paper_formula() -> None:
    state = cluster([0] * 8, [1000] * 4 + [0] * 4, cards=8)
    _, scores = Scheduler(state, make_policy("dotprod")).filter_and_score(slice_pod("p", 1000, count=4, cpu=0))
    # CPU 100m (non-zero rule) on 64000m free: 0.5 * 100/128000; GPU 8000 or 4000 free for 4000
    assert scores.tolist() == [int(100 * (1 - (0.5 * 100 / 128_000 + 1.0 * 0.5) / 2)),
                               int(100 * (1 - (0.5 * 100 / 128_000 + 0.5 * 0.5) / 2))]
    assert scores.tolist() == [74, 87]


# ------------------------------------------------------------------------------------ packing


@pytest.mark.parametrize(
    ("used", "milli", "expected", "scores"),
    [
        # a partly used card (95) beats an idle card on a used node (49) beats an idle node (31)
        ([[0, 0], [1000, 0], [0, 500]], 300, ("n2", (1,)), [31, 49, 95]),
        # on partly used cards, the fuller one wins: 100 - (free*100//1000)//10
        ([[0, 200], [0, 700]], 300, ("n1", (1,)), [92, 97]),
    ],
)
def test_packing(used: list[list[int]], milli: int, expected: tuple[str, tuple[int, ...]],
                 scores: list[int]) -> None:
    state = cluster(*used)
    assert decide("packing", state, slice_pod("p", milli), prefer=list(range(len(used)))) == expected
    _, got = Scheduler(state, make_policy("packing")).filter_and_score(slice_pod("p", milli))
    assert got.tolist() == scores


def test_packing_ignores_cpu_only_pods() -> None:
    state = cluster([0, 0], [0, 500])
    _, scores = Scheduler(state, make_policy("packing")).filter_and_score(cpu_pod("p"))
    assert scores.tolist() == [0, 0]


# --------------------------------------------------------------------------------- clustering


def test_clustering_puts_pods_with_the_same_shape_together() -> None:
    state = cluster([0, 0], [0, 0], [0, 0])
    state.apply(_placed(state, "n1", slice_pod("share", 300)))
    state.apply(_placed(state, "n2", slice_pod("whole", 1000)))
    assert decide("clustering", state, slice_pod("p", 300), prefer=[0, 2, 1])[0] == "n1"
    assert decide("clustering", state, slice_pod("q", 1000), prefer=[0, 1, 2])[0] == "n2"
    # a 2-card pod has no group yet: the empty node (+25) beats mixing with others (+0)
    assert decide("clustering", state, slice_pod("r", 1000, count=2), prefer=[1, 2, 0])[0] == "n0"


def test_clustering_scores() -> None:
    state = cluster([0, 0], [0, 0], [0, 0])
    state.apply(_placed(state, "n1", slice_pod("share", 300)))
    state.apply(_placed(state, "n2", slice_pod("share2", 300)))
    state.apply(_placed(state, "n2", slice_pod("whole", 1000)))
    _, scores = Scheduler(state, make_policy("clustering")).filter_and_score(slice_pod("p", 300))
    # base 25 * (8000 - free) // 8000 (the paper's 8-card constant): 18, 19, 22;
    # bonus: empty node 25, only share-gpu pods 75, share-gpu among two tags 50
    assert scores.tolist() == [43, 94, 72]


def _placed(state: ClusterState, node: str, pod: PodRequest) -> Placement:
    from gpupool.core.cards import assign_on_node

    result = assign_on_node(state, state.index[node], pod)
    assert isinstance(result, Placement)
    return result


# ---------------------------------------------------------------------------------------- fgd


def test_fgd_fills_a_fragment_instead_of_the_least_leftover_node() -> None:
    # n0 free [1000, 300]: a 300 slice on card 1 removes 300 of fragment -> int(100 * sigmoid(0.3)) = 57
    # n1 free [600, 600]: any 300 slice leaves a 300 fragment -> 42. Best fit would take n1.
    state = cluster([0, 700], [400, 400])
    assert decide("fgd", state, slice_pod("p", 300), profile=only(HALF), prefer=[1, 0]) == ("n0", (1,))
    _, scores = Scheduler(state, make_policy("fgd"), profile=only(HALF)).filter_and_score(slice_pod("p", 300))
    assert scores.tolist() == [57, 42]


def test_fgd_card_choice_keeps_cards_usable_for_the_workload() -> None:
    # free [1000, 600]: 200 on card 1 leaves 400 (< 500, a new fragment); card 0 keeps both usable
    state = cluster([0, 400])
    assert decide("fgd", state, slice_pod("p", 200), profile=only(HALF)) == ("n0", (0,))
    assert decide("bestfit", state, slice_pod("p", 200)) == ("n0", (1,))


def test_fgd_whole_card_pods_avoid_breaking_the_last_pair() -> None:
    pair = TypicalPod(cpu_milli=100, milli=1000, count=2, models=frozenset(), freq=1.0)
    state = cluster([0, 0], [0, 0, 0], cards=2)
    # n0 has exactly one pair: taking a card makes 1000 fragment; n1 keeps a pair after one card
    assert decide("fgd", state, slice_pod("p", 1000), profile=only(pair), prefer=[0, 1])[0] == "n1"


def test_fgd_ties_follow_the_node_order() -> None:
    state = cluster([0, 0], [0, 500])
    for prefer, node in (([0, 1], "n0"), ([1, 0], "n1")):
        assert decide("fgd", state, slice_pod("p", 500), profile=only(HALF), prefer=prefer)[0] == node


def test_fgd_without_profile_scores_everything_equal() -> None:
    state = cluster([0, 0], [0, 500])
    _, scores = Scheduler(state, make_policy("fgd")).filter_and_score(slice_pod("p", 300))
    assert scores.tolist() == [50, 50]


# ------------------------------------------------------------------------------------ gpupool


def gpupool_bin(gain: float) -> float:
    """gpupool's node score: the sigmoid of the fragmentation gain in ``levels`` equal bins."""
    levels = POLICIES["gpupool"].levels  # type: ignore[attr-defined]
    return float(np.floor(levels / (1.0 + np.exp(-gain / 1000.0))))


def test_gpupool_follows_the_fragmentation_gradient() -> None:
    state = cluster([0, 700], [400, 400])
    assert decide("gpupool", state, slice_pod("p", 300), profile=only(HALF), prefer=[1, 0]) == ("n0", (1,))
    _, scores = Scheduler(state, make_policy("gpupool"), profile=only(HALF)).filter_and_score(slice_pod("p", 300))
    # FGD gains +300 (n0's 300 hole filled) and -300 (n1 left with a 300 hole); both holes are also
    # dead (the workload's only slice, 500, fits neither), which gpupool counts on top
    dead = POLICIES["gpupool"].dead_hole_weight * 300  # type: ignore[attr-defined]
    assert scores.tolist() == [gpupool_bin(300 + dead), gpupool_bin(-300 - dead)]
    assert scores[0] > scores[1]


def test_gpupool_takes_the_tightest_card_within_the_best_bin() -> None:
    # free [1000, 500]: both cards keep fragmentation at 0; FGD takes the lowest index, gpupool packs
    state = cluster([0, 500])
    assert decide("fgd", state, slice_pod("p", 500), profile=only(HALF)) == ("n0", (0,))
    assert decide("gpupool", state, slice_pod("p", 500), profile=only(HALF)) == ("n0", (1,))


def test_gpupool_leaves_near_equal_nodes_to_the_node_order() -> None:
    # n1: a 5-milli slice fills a 5-milli fragment (gain 5); n0: gain 0. Same bin: node order decides.
    state = cluster([0, 0], [0, 995])
    assert gpupool_bin(5) == gpupool_bin(0)
    for prefer, node in (([0, 1], "n0"), ([1, 0], "n1")):
        assert decide("gpupool", state, slice_pod("p", 5), profile=only(HALF), prefer=prefer)[0] == node


def test_gpupool_card_choice_still_avoids_new_fragments() -> None:
    # free [1000, 600]: 200 on card 1 (tighter) would leave a 400 fragment: a worse bin
    state = cluster([0, 400])
    assert decide("gpupool", state, slice_pod("p", 200), profile=only(HALF)) == ("n0", (0,))


# ------------------------------------------------------------------------- all policies agree


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_policy_skips_infeasible_nodes(name: str) -> None:
    state = cluster([1000, 1000], [700, 800], [0, 1000])
    assert decide(name, state, slice_pod("p", 1000), profile=only(HALF), prefer=[0, 1, 2]) == ("n2", (0,))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_policy_reports_a_pod_that_fits_nowhere(name: str) -> None:
    state = cluster([1000, 0], [0, 1000])
    scheduler = Scheduler(state, make_policy(name), profile=only(HALF))
    decision = scheduler.decide(slice_pod("p", 1000, count=2))
    assert decision == Unschedulable("p", "no node can hold the pod")
    assert scheduler.explain(slice_pod("p", 1000, count=2), np.arange(2)) == {
        "n0": "needs 2 idle whole card(s); 1 idle", "n1": "needs 2 idle whole card(s); 1 idle"}


# ------------------------------------------------------------------------- dra-allocator


def test_dra_allocator_takes_the_first_card_that_fits_where_gpupool_takes_the_tightest() -> None:
    state = cluster([0, 600], cards=2)  # card 0 empty, card 1 with 400 left
    assert decide("dra-allocator", cluster([0, 600], cards=2), slice_pod("p", 300))[1] == (0,)
    assert decide("gpupool", state, slice_pod("p", 300))[1] == (1,)
    assert decide("dra-allocator", cluster([800, 0, 600], cards=3), slice_pod("p", 300))[1] == (1,)


def test_dra_allocator_scores_nodes_as_kube_schedulers_default_plugins() -> None:
    """n0 holds 32 of 64 cores and 64 of 256 GiB; n1 nothing. A pod of 8 cores and 32 GiB:
    LeastAllocated n0 (24/64*100=37, 160/256*100=62) -> 49, n1 (87, 87) -> 87; BalancedAllocation
    n0 with the pod (1-|0.625-0.375|/2)*100=87, without (1-|0.5-0.25|/2)*100=87 -> 50+(50+0)/2=75,
    n1 with 100, without 100 -> 75."""
    from gpupool.core.policies.base import PodShape
    from gpupool.core.policies.dra_allocator import DraAllocatorPolicy

    state = ClusterState([make_node("n0", memory=262_144), make_node("n1", memory=262_144)])
    state.apply(raw_placement("busy", "n0", [], cpu=32_000, memory=65_536))
    shape = PodShape(cpu_milli=8_000, memory_mib=32_768, gpu=None)
    rows = np.arange(2, dtype=np.int64)
    scores = DraAllocatorPolicy().node_score(state, shape, rows, np.zeros((2, 2), dtype=bool))
    assert scores.tolist() == [49 + 75, 87 + 75]
    assert decide("dra-allocator", state, slice_pod("p", 300, cpu=8_000, memory=32_768))[0] == "n1"


def test_dra_steered_takes_gpupools_node_and_the_allocators_first_fit_card() -> None:
    """The DRA path with gpupool's scheduler choosing the node (docs/dra.md): node as ``gpupool``
    chooses it, card as the allocator does."""
    state = cluster([0, 600], cards=2)
    assert decide("dra-steered", state, slice_pod("p", 300))[1] == (0,)
    assert decide("gpupool", state, slice_pod("p", 300))[1] == (1,)
    busy = ClusterState([make_node("n0", memory=262_144), make_node("n1", memory=262_144)])
    busy.apply(raw_placement("busy", "n0", [], cpu=32_000, memory=65_536))
    pod = slice_pod("p", 300, cpu=8_000, memory=32_768)
    assert decide("dra-steered", busy, pod)[0] == decide("gpupool", busy, pod)[0]
