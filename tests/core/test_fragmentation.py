"""The fragmentation measure (FGD, ATC'23): typical pods, node fragment, incremental updates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.fragmentation import (
    FragmentationMeasure,
    TypicalPod,
    WorkloadProfile,
    primary_gpu,
    shape_of,
)
from gpupool.core.model import CardMode, CardSlice, ContainerRequest, GpuRequest, PodRequest
from gpupool.core.state import ClusterState
from tests.core.builders import book_slice, book_whole, cpu_pod, make_node, raw_placement, rows, slice_pod

# ------------------------------------------------------------------------------ typical pods


def test_shape_of() -> None:
    assert shape_of(slice_pod("p", 300, cpu=4_000)) == (4_000, 300, 1, frozenset())
    assert shape_of(slice_pod("p", 1000, count=4, cpu=0, models=["V100"])) == (100, 1000, 4, frozenset({"V100"}))
    assert shape_of(cpu_pod("p", cpu=2_000)) == (2_000, 0, 0, frozenset())
    assert shape_of(cpu_pod("p", cpu=0)) == (100, 0, 0, frozenset())  # k8s counts 0 CPU as 100m


def test_primary_gpu_is_the_largest_container() -> None:
    small, big = GpuRequest.fraction(300, 2), GpuRequest.whole(1)
    pod = PodRequest("p", (ContainerRequest("a", gpu=small), ContainerRequest("b"), ContainerRequest("c", gpu=big)))
    assert primary_gpu(pod) == big  # 2 x 300 = 600 < one whole card
    pod = PodRequest("p", (ContainerRequest("a", gpu=GpuRequest.fraction(600, 2)), ContainerRequest("c", gpu=big)))
    assert primary_gpu(pod) == GpuRequest.fraction(600, 2)
    assert primary_gpu(cpu_pod("p")) is None


def _pods(spec: list[tuple[int, int, int]]) -> list[PodRequest]:
    """``(how many, cpu, milli)`` -> pods (milli 0: CPU-only)."""
    pods: list[PodRequest] = []
    for n, cpu, milli in spec:
        for _ in range(n):
            key = f"p{len(pods)}"
            pods.append(slice_pod(key, milli, cpu=cpu) if milli else cpu_pod(key, cpu=cpu))
    return pods


def test_profile_keeps_the_shortest_prefix_reaching_coverage_and_renormalises() -> None:
    pods = _pods([(5, 1000, 500), (3, 2000, 1000), (1, 1000, 250), (1, 4000, 0)])
    profile = WorkloadProfile.from_pods(pods, coverage=0.8)
    assert profile.pods == (
        TypicalPod(1000, 500, 1, frozenset(), 5 / 8),
        TypicalPod(2000, 1000, 1, frozenset(), 3 / 8),
    )


def test_profile_default_coverage_is_95_percent() -> None:
    pods = _pods([(5, 1000, 500), (3, 2000, 1000), (1, 1000, 250), (1, 4000, 0)])
    profile = WorkloadProfile.from_pods(pods)
    # 9 of 10 pods is 90 % < 95 %: all four shapes; equal counts rank larger shapes first
    assert [(p.cpu_milli, p.milli, p.freq) for p in profile.pods] == [
        (1000, 500, 0.5), (2000, 1000, 0.3), (4000, 0, 0.1), (1000, 250, 0.1)]
    assert sum(p.freq for p in profile.pods) == pytest.approx(1.0)


def test_profile_exact_coverage_boundary() -> None:
    pods = _pods([(9, 1000, 500), (1, 1000, 100)])
    assert len(WorkloadProfile.from_pods(pods, coverage=0.9).pods) == 1  # 9 >= 0.9 * 10
    assert len(WorkloadProfile.from_pods(pods, coverage=0.91).pods) == 2


def test_profile_ties_rank_by_shape_descending() -> None:
    pods = _pods([(1, 100, 500), (1, 200, 100), (1, 200, 300)])
    profile = WorkloadProfile.from_pods(pods, coverage=0.3)
    assert [(p.cpu_milli, p.milli, p.freq) for p in profile.pods] == [(200, 300, 1.0)]


def test_profile_groups_by_models_and_count_not_memory() -> None:
    pods = [slice_pod("a", 1000, count=2, memory=1), slice_pod("b", 1000, count=2, memory=99_999),
            slice_pod("c", 1000, count=2, models=["T4"])]
    profile = WorkloadProfile.from_pods(pods, coverage=1.0)
    assert [(p.count, p.models, p.freq) for p in profile.pods] == [
        (2, frozenset(), pytest.approx(2 / 3)), (2, frozenset({"T4"}), pytest.approx(1 / 3))]


def test_empty_profile() -> None:
    assert WorkloadProfile.from_pods([]).pods == ()


# --------------------------------------------------------------------------- node fragment

A = TypicalPod(cpu_milli=1000, milli=500, count=1, models=frozenset(), freq=0.5)
B = TypicalPod(cpu_milli=1000, milli=1000, count=1, models=frozenset(), freq=0.3)
C = TypicalPod(cpu_milli=1000, milli=0, count=0, models=frozenset(), freq=0.2)


def one_node(free: list[int], *, cpu: int = 64_000, model: str = "A", unhealthy: tuple[int, ...] = (),
             exclusive: tuple[int, ...] = ()) -> ClusterState:
    state = ClusterState([make_node("n", len(free), cpu=cpu, model=model, unhealthy=unhealthy)])
    for card, left in enumerate(free):
        if card in exclusive:
            book_whole(state, f"w{card}", "n", card)
        elif left < 1000:
            book_slice(state, f"s{card}", "n", card, compute=1000 - left)
    return state


def frag(state: ClusterState, *pods: TypicalPod) -> float:
    return float(FragmentationMeasure(state, WorkloadProfile(pods)).node_fragment(rows(0))[0])


def solo(milli: int, count: int = 1, cpu: int = 1000, models: frozenset[str] = frozenset()) -> TypicalPod:
    return TypicalPod(cpu_milli=cpu, milli=milli, count=count, models=models, freq=1.0)


@pytest.mark.parametrize(
    ("free", "pod", "expected"),
    [
        # Q3: only cards smaller than the class's slice are fragment
        pytest.param([1000, 300], solo(500), 300, id="small-card-is-fragment"),
        pytest.param([1000, 600], solo(500), 0, id="large-cards-usable"),
        pytest.param([400, 300, 1000], solo(500), 700, id="two-small-cards-fragment"),
        # 300 >= 300: usable
        pytest.param([400, 300, 1000], solo(300), 0, id="exactly-the-slice-usable"),
        pytest.param([400, 300, 1000], solo(301), 300, id="just-under-the-slice"),
        # a full card adds nothing
        pytest.param([0, 1000], solo(500), 0, id="full-card-adds-nothing"),
        # Q2: no card (or too few) can take the class: all idle is fragment
        pytest.param([400, 300], solo(500), 700, id="no-card-takes-it"),
        pytest.param([1000, 300], solo(1000, count=2), 1300, id="too-few-whole-cards"),
        pytest.param([1000, 1000], solo(1000, count=2), 0, id="enough-whole-cards"),
        pytest.param([1000, 900, 1000], solo(900, count=3), 0, id="enough-cards-for-three"),
        # CPU-only class: every idle card counts, satisfied or not
        pytest.param([1000, 300], solo(0, count=0), 1300, id="cpu-only-class"),
    ],
)
def test_node_fragment_single_class(free: list[int], pod: TypicalPod, expected: float) -> None:
    assert frag(one_node(free), pod) == pytest.approx(expected)


def test_lack_of_cpu_makes_all_idle_fragment() -> None:
    assert frag(one_node([1000, 300], cpu=999), solo(500, cpu=1000)) == pytest.approx(1300)
    assert frag(one_node([1000, 300], cpu=1000), solo(500, cpu=1000)) == pytest.approx(300)


def test_model_not_allowed_makes_all_idle_fragment() -> None:
    state = one_node([1000, 300], model="T4")
    assert frag(state, solo(500, models=frozenset({"V100"}))) == pytest.approx(1300)
    assert frag(state, solo(500, models=frozenset({"V100", "T4"}))) == pytest.approx(300)


def test_unhealthy_and_exclusive_cards_have_nothing_idle() -> None:
    assert frag(one_node([1000, 300, 1000], unhealthy=(0,)), solo(500)) == pytest.approx(300)
    assert frag(one_node([1000, 300, 1000], exclusive=(0,)), solo(500)) == pytest.approx(300)


def test_mixed_profile_by_hand() -> None:
    # free [1000, 300], idle 1300: A is satisfied by card 0 -> 0.5 * 300; B by card 0 -> 0.3 * 300;
    # the CPU-only class C counts every idle milli -> 0.2 * 1300
    assert frag(one_node([1000, 300]), A, B, C) == pytest.approx(150 + 90 + 260)


def test_after_slice_by_hand() -> None:
    state = one_node([1000, 300])
    measure = FragmentationMeasure(state, WorkloadProfile((A, B, C)))
    after = measure.after_slice(rows(0), milli=200, cpu=100)
    # card 0 -> [800, 300]: A 0.5 * 300, B unsatisfied 0.3 * 1100, C 0.2 * 1100
    # card 1 -> [1000, 100]: A 0.5 * 100, B 0.3 * 100, C 0.2 * 1100
    np.testing.assert_allclose(after[0, :2], [150 + 330 + 220, 50 + 30 + 220])


def test_after_slice_respects_cpu() -> None:
    state = one_node([1000, 1000], cpu=1_500)
    measure = FragmentationMeasure(state, WorkloadProfile((solo(500, cpu=1000),)))
    assert measure.after_slice(rows(0), 100, cpu=400)[0, 0] == pytest.approx(0)      # 1100m left
    assert measure.after_slice(rows(0), 100, cpu=600)[0, 0] == pytest.approx(1900)   # 900m left


def test_after_whole_and_after_taking() -> None:
    state = one_node([1000, 1000, 300])
    measure = FragmentationMeasure(state, WorkloadProfile((solo(1000, count=2),)))
    assert measure.node_fragment(rows(0))[0] == pytest.approx(300)
    assert measure.after_whole(rows(0), 1, cpu=100)[0] == pytest.approx(1300)
    taken = np.zeros((1, state.max_cards), dtype=bool)
    taken[0, 2] = True
    assert measure.after_taking(rows(0), taken, 300, cpu=0)[0] == pytest.approx(0)
    assert measure.after_taking(rows(0), taken, None, cpu=0)[0] == pytest.approx(0)


def test_measure_sees_models_registered_after_construction() -> None:
    state = ClusterState([make_node("a", 1, model="T4")])
    measure = FragmentationMeasure(state, WorkloadProfile((solo(500, models=frozenset({"V100"})),)))
    assert measure.node_fragment(rows(0))[0] == pytest.approx(1000)
    state.upsert_node(make_node("b", 1, model="V100"))
    np.testing.assert_allclose(measure.node_fragment(rows(0, 1)), [1000, 0])


# ---------------------------------------------------------------- properties against the spec


def spec_node_fragment(gpu_left: list[int], cpu_left: int, node_model: str,
                       typical: tuple[TypicalPod, ...]) -> float:
    """``NodeGpuShareFragAmount`` summed over all types but Q3, written as /tmp/fgd_spec.md §1 states it."""
    idle = sum(gpu_left)
    total = 0.0
    for pod in typical:
        if pod.milli == 0:                                   # XL / XR: all idle counts
            total += pod.freq * idle
            continue
        if pod.models and node_model not in pod.models:      # NoAccess
            total += pod.freq * idle
            continue
        gpu_ok = sum(1 for left in gpu_left if left >= pod.milli) >= pod.count
        cpu_ok = cpu_left >= pod.cpu_milli
        if gpu_ok and cpu_ok:                                # Q3: only cards too small for one slice
            total += pod.freq * sum(left for left in gpu_left if left < pod.milli)
        else:                                                # Q1, Q2, Q4
            total += pod.freq * idle
    return total


MODELS = ("A", "B")


@st.composite
def fragment_case(draw: st.DrawFn) -> tuple[ClusterState, WorkloadProfile, list[str]]:
    """Up to three nodes of up to four cards with random slices, whole cards, unhealthy cards and CPU
    use, and a random profile of up to five typical pods."""
    n_nodes = draw(st.integers(1, 3))
    specs, plans, models = [], [], []
    for i in range(n_nodes):
        n_cards = draw(st.integers(0, 4))
        model = draw(st.sampled_from(MODELS))
        cpu = draw(st.sampled_from([500, 2_000, 8_000, 64_000]))
        used = draw(st.lists(st.sampled_from([0, 0, 100, 250, 500, 700, 1000]), min_size=n_cards,
                             max_size=n_cards))
        whole = draw(st.lists(st.booleans(), min_size=n_cards, max_size=n_cards))
        unhealthy = [c for c in range(n_cards) if draw(st.integers(0, 9)) == 0]
        cpu_used = min(draw(st.sampled_from([0, 100, 400, 1_500])), cpu)
        specs.append(make_node(f"n{i}", n_cards, cpu=cpu, model=model, unhealthy=unhealthy))
        plans.append((used, whole, cpu_used))
        models.append(model)
    state = ClusterState(specs)
    for row, (used, whole, cpu_used) in enumerate(plans):
        name = f"n{row}"
        state.apply(raw_placement(f"{name}-cpu", name, [], cpu=cpu_used))
        for card, (u, w) in enumerate(zip(used, whole, strict=True)):
            if not state.card_healthy[row, card]:
                continue
            if w and u == 1000:
                book_whole(state, f"{name}-w{card}", name, card)
            elif u:
                book_slice(state, f"{name}-s{card}", name, card, compute=u)
    classes = draw(st.lists(
        st.tuples(st.sampled_from([100, 1000, 4000]), st.sampled_from([0, 100, 300, 500, 800, 1000]),
                  st.integers(1, 3), st.sampled_from([(), ("A",), ("B",), ("A", "B")]),
                  st.integers(1, 10)),
        min_size=1, max_size=5))
    weight = sum(c[4] for c in classes)
    profile = WorkloadProfile(tuple(
        TypicalPod(cpu_milli=cpu, milli=milli, count=count if milli else 0, models=frozenset(allowed),
                   freq=w / weight)
        for cpu, milli, count, allowed, w in classes))
    return state, profile, models


def gpu_left(state: ClusterState, row: int) -> list[int]:
    usable = state.card_exists[row] & state.card_healthy[row]
    return [int(v) for v in np.where(usable, state.card_compute_free[row], 0)[: int(state.card_count[row])]]


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(fragment_case())
def test_node_fragment_matches_the_spec_formula(case: tuple[ClusterState, WorkloadProfile, list[str]]) -> None:
    state, profile, models = case
    got = FragmentationMeasure(state, profile).node_fragment(np.arange(state.size, dtype=np.int64))
    for row in range(state.size):
        expected = spec_node_fragment(gpu_left(state, row), int(state.cpu_free[row]), models[row],
                                      profile.pods)
        assert got[row] == pytest.approx(expected, abs=1e-6)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(fragment_case(), st.sampled_from([50, 100, 300, 500, 1000]), st.sampled_from([0, 100, 1_000]))
def test_after_slice_matches_fragment_recomputed_from_scratch(
        case: tuple[ClusterState, WorkloadProfile, list[str]], milli: int, cpu: int) -> None:
    state, profile, _ = case
    measure = FragmentationMeasure(state, profile)
    all_rows = np.arange(state.size, dtype=np.int64)
    predicted = measure.after_slice(all_rows, milli, cpu)
    fits = (state.card_exists & state.card_healthy & (state.card_mode != CardMode.EXCLUSIVE)
            & (state.card_compute_free >= milli))
    for row in range(state.size):
        if state.cpu_free[row] < cpu:
            continue
        node = state.specs[row].name
        for card in np.flatnonzero(fits[row]):
            state.apply(raw_placement("probe", node, [CardSlice(int(card), 0, milli)], cpu=cpu))
            actual = measure.node_fragment(all_rows)
            state.release("probe")
            assert predicted[row, card] == pytest.approx(actual[row], abs=1e-6)
            # other nodes are untouched by a slice elsewhere
            np.testing.assert_allclose(np.delete(actual, row),
                                       np.delete(measure.node_fragment(all_rows), row))


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(fragment_case(), st.integers(1, 3), st.sampled_from([0, 100, 1_000]))
def test_after_whole_matches_fragment_recomputed_from_scratch(
        case: tuple[ClusterState, WorkloadProfile, list[str]], count: int, cpu: int) -> None:
    state, profile, _ = case
    measure = FragmentationMeasure(state, profile)
    all_rows = np.arange(state.size, dtype=np.int64)
    predicted = measure.after_whole(all_rows, count, cpu)
    idle = state.card_exists & state.card_healthy & (state.card_mode == CardMode.IDLE)
    for row in range(state.size):
        cards = np.flatnonzero(idle[row])
        if len(cards) < count or state.cpu_free[row] < cpu:
            continue
        node = state.specs[row].name
        slices = [CardSlice(int(c), 16_384, 1000, exclusive=True) for c in cards[-count:]]  # any idle cards
        state.apply(raw_placement("probe", node, slices, cpu=cpu))
        actual = measure.node_fragment(all_rows)
        state.release("probe")
        assert predicted[row] == pytest.approx(actual[row], abs=1e-6)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(fragment_case(), st.sampled_from([0, 100, 1_000, 4_000]))
def test_cpu_only_after_matches_fragment_recomputed_from_scratch(
        case: tuple[ClusterState, WorkloadProfile, list[str]], cpu: int) -> None:
    """A CPU-only pod's "after" reuses the cards' pass of the "before": the same numbers as the
    measure of the node with the pod booked, bit for bit."""
    state, profile, _ = case
    measure = FragmentationMeasure(state, profile)
    all_rows = np.arange(state.size, dtype=np.int64)
    before, after = measure.before_and_after_taking(all_rows, None, 0, cpu)
    assert before.tolist() == measure.node_fragment(all_rows).tolist()
    for row in range(state.size):
        if state.cpu_free[row] < cpu:
            continue
        state.apply(raw_placement("probe", state.specs[row].name, [], cpu=cpu))
        actual = measure.node_fragment(all_rows)
        state.release("probe")
        assert after[row] == actual[row]


@pytest.mark.parametrize("cards", [
    pytest.param(8, id="narrow-passes"),
    pytest.param(40, id="wide-node-needs-int32"),  # 40 idle cards: 40,000 free, beyond int16
])
def test_sums_over_a_node_stay_exact_whatever_its_card_count(cards: int) -> None:
    """A class that cannot use the cards (too few for its count) leaves all their compute a fragment,
    and a slice on one card removes exactly the slice from it."""
    state = ClusterState([make_node("n", cards)], max_cards=cards)
    wide = TypicalPod(cpu_milli=100, milli=1000, count=cards + 1, models=frozenset(), freq=1.0)
    small = TypicalPod(cpu_milli=100, milli=100, count=1, models=frozenset(), freq=1.0)
    measure = FragmentationMeasure(state, WorkloadProfile((wide, small)))
    assert measure.node_fragment(rows(0)).tolist() == [1000.0 * cards]
    before, after = measure.before_and_after_slice(rows(0), 300, 100)
    assert before.tolist() == [1000.0 * cards]
    assert after[0].tolist() == [1000.0 * cards - 300] * cards
