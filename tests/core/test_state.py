"""The allocation ledger: booking, refusing over-commit, exclusive/shared modes, node changes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpupool.core.model import CardMode, CardSlice, ContainerAssignment, Placement
from gpupool.core.state import AllocationError, ClusterState
from tests.core.builders import book_slice, book_whole, ledger_snapshot, make_node, raw_placement


@pytest.fixture
def state() -> ClusterState:
    return ClusterState([make_node("n0", 2, cpu=8_000, memory=32_000), make_node("n1", 4)])


def usage(state: ClusterState, node: str, card: int) -> tuple[int, int, CardMode]:
    u = state.card_usage(node)[card]
    return u.memory_free, u.compute_free, u.mode


def test_initial_ledger(state: ClusterState) -> None:
    assert state.size == 2
    assert state.max_cards == 8
    assert [u.memory_total for u in state.card_usage("n0")] == [16_384, 16_384]
    assert usage(state, "n1", 3) == (16_384, 1000, CardMode.IDLE)
    assert int(state.cpu_free[0]) == 8_000
    assert int(state.mem_free[0]) == 32_000
    assert state.total_compute() == 6000
    assert state.allocated_compute() == 0


def test_max_cards_grows_for_large_nodes() -> None:
    state = ClusterState([make_node("big", 10)])
    assert state.max_cards == 10
    assert len(state.card_usage("big")) == 10


def test_apply_books_cpu_memory_and_slices(state: ClusterState) -> None:
    placement = raw_placement("p", "n0", [CardSlice(1, 4000, 300)], cpu=1500, memory=2048)
    assert state.check(placement) is None
    state.apply(placement)
    assert int(state.cpu_free[0]) == 6_500
    assert int(state.mem_free[0]) == 29_952
    assert usage(state, "n0", 1) == (12_384, 700, CardMode.SHARED)
    assert usage(state, "n0", 0) == (16_384, 1000, CardMode.IDLE)
    assert state.allocated_compute() == 300
    assert state.placements["p"] == placement
    assert state.pods_on[0] == {"p"}


def test_release_restores_and_returns_the_placement(state: ClusterState) -> None:
    before = ledger_snapshot(state)
    placement = book_slice(state, "p", "n0", 0, compute=300, memory=4000, cpu=100)
    assert state.release("p") == placement
    after = ledger_snapshot(state)
    for name in before:
        np.testing.assert_array_equal(before[name], after[name], err_msg=name)
    assert state.release("p") is None  # deletes can repeat
    assert state.release("never-booked") is None
    assert state.pods_on[0] == set()


@pytest.mark.parametrize(
    ("slices", "cpu", "memory", "message"),
    [
        pytest.param([], 8_001, 0, "node n0: 8001m CPU requested, 8000m free", id="cpu-short"),
        pytest.param([], 0, 32_001, "node n0: 32001 MiB memory requested, 32000 MiB free", id="memory-short"),
        pytest.param(
            [CardSlice(0, 16_385, 1)], 0, 0, "node n0 card 0: 16385 MiB requested, 16384 MiB free",
            id="card-memory-short",
        ),
        pytest.param(
            [CardSlice(0, 1, 1001)], 0, 0, "node n0 card 0: compute 1001/1000 requested, 1000/1000 free",
            id="card-compute-short",
        ),
        pytest.param([CardSlice(2, 1, 1)], 0, 0, "node n0 has no card 2", id="card-past-the-end"),
        pytest.param([CardSlice(-1, 1, 1)], 0, 0, "node n0 has no card -1", id="negative-card"),
        pytest.param([CardSlice(8, 1, 1)], 0, 0, "node n0 has no card 8", id="card-far-past-the-end"),
    ],
)
def test_check_refuses_over_commit(state: ClusterState, slices: list[CardSlice], cpu: int, memory: int,
                                   message: str) -> None:
    placement = raw_placement("p", "n0", slices, cpu=cpu, memory=memory)
    assert state.check(placement) == message
    before = ledger_snapshot(state)
    with pytest.raises(AllocationError, match=message):
        state.apply(placement)
    for name, array in ledger_snapshot(state).items():  # nothing changed
        np.testing.assert_array_equal(array, before[name])
    assert "p" not in state.placements


def test_check_refuses_unknown_node_and_duplicate_pod(state: ClusterState) -> None:
    assert state.check(raw_placement("p", "nope", [])) == "node nope is not known"
    book_slice(state, "p", "n0", 0, compute=100)
    assert state.check(raw_placement("p", "n1", [CardSlice(0, 0, 100)])) == "pod p already holds a placement"


def test_memory_is_refused_on_a_shared_card_once_slices_add_up(state: ClusterState) -> None:
    book_slice(state, "a", "n0", 0, memory=10_000, compute=100)
    book_slice(state, "b", "n0", 0, memory=6_000, compute=100)
    assert usage(state, "n0", 0) == (384, 800, CardMode.SHARED)
    assert state.check(raw_placement("c", "n0", [CardSlice(0, 385, 0)])) == (
        "node n0 card 0: 385 MiB requested, 384 MiB free")
    assert state.check(raw_placement("c", "n0", [CardSlice(0, 384, 0)])) is None


def test_compute_is_refused_on_a_shared_card_once_slices_add_up(state: ClusterState) -> None:
    book_slice(state, "a", "n0", 0, compute=700)
    assert state.check(raw_placement("b", "n0", [CardSlice(0, 0, 301)])) == (
        "node n0 card 0: compute 301/1000 requested, 300/1000 free")
    book_slice(state, "b", "n0", 0, compute=300)
    assert usage(state, "n0", 0) == (16_384, 0, CardMode.SHARED)


def test_exclusive_card_is_closed_to_sharing(state: ClusterState) -> None:
    book_whole(state, "w", "n0", 0)
    assert usage(state, "n0", 0) == (0, 0, CardMode.EXCLUSIVE)
    # even a slice asking for nothing may not join an exclusive card
    assert state.check(raw_placement("s", "n0", [CardSlice(0, 0, 0)])) == "node n0 card 0 is held exclusively"
    assert state.check(raw_placement("s", "n0", [CardSlice(0, 1, 1)])) == "node n0 card 0 is held exclusively"
    second = raw_placement("w2", "n0", [CardSlice(0, 16_384, 1000, exclusive=True)])
    assert state.check(second) == "node n0 card 0 is in use; a whole-card request needs it idle"


def test_shared_card_refuses_a_whole_card_request(state: ClusterState) -> None:
    book_slice(state, "s", "n0", 1, memory=1, compute=0)  # even a tiny memory-only slice shares it
    whole = raw_placement("w", "n0", [CardSlice(1, 16_384, 1000, exclusive=True)])
    assert state.check(whole) == "node n0 card 1 is in use; a whole-card request needs it idle"


def test_mode_returns_to_idle_after_the_last_release(state: ClusterState) -> None:
    book_slice(state, "a", "n0", 0, compute=200, memory=100)
    book_slice(state, "b", "n0", 0, compute=300, memory=200)
    assert int(state.card_holders[0, 0]) == 2
    state.release("a")
    assert usage(state, "n0", 0) == (16_184, 700, CardMode.SHARED)
    state.release("b")
    assert usage(state, "n0", 0) == (16_384, 1000, CardMode.IDLE)
    assert int(state.card_holders[0, 0]) == 0
    # idle again: a whole card is accepted
    book_whole(state, "w", "n0", 0)
    state.release("w")
    assert usage(state, "n0", 0) == (16_384, 1000, CardMode.IDLE)


def test_multi_container_placement_counts_one_holder_per_card(state: ClusterState) -> None:
    placement = Placement("p", "n0", 0, 0, (
        ContainerAssignment("a", (CardSlice(0, 100, 100),)),
        ContainerAssignment("b", (CardSlice(0, 100, 100),)),
    ))
    state.apply(placement)
    assert int(state.card_holders[0, 0]) == 1
    assert usage(state, "n0", 0) == (16_184, 800, CardMode.SHARED)


def test_init_containers_are_booked_as_max_not_sum(state: ClusterState) -> None:
    placement = Placement("p", "n0", 0, 0, (
        ContainerAssignment("a", (CardSlice(0, 8_000, 600),)),
        ContainerAssignment("i", (CardSlice(0, 10_000, 600),), init=True),
    ))
    state.apply(placement)
    assert usage(state, "n0", 0) == (6_384, 400, CardMode.SHARED)


def test_unhealthy_card_refuses_new_slices_but_keeps_bookings(state: ClusterState) -> None:
    book_slice(state, "a", "n0", 0, compute=200)
    state.set_card_health("n0", 0, False)
    assert state.check(raw_placement("b", "n0", [CardSlice(0, 0, 100)])) == "node n0 card 0 is unhealthy"
    assert state.card_usage("n0")[0].healthy is False
    assert "a" in state.placements
    assert usage(state, "n0", 0)[1] == 800
    state.set_card_health("n0", 0, True)
    assert state.check(raw_placement("b", "n0", [CardSlice(0, 0, 100)])) is None
    with pytest.raises(AllocationError, match="node n0 has no card 5"):
        state.set_card_health("n0", 5, False)


def test_node_declared_with_an_unhealthy_card() -> None:
    state = ClusterState([make_node("n", 2, unhealthy=[1])])
    assert state.check(raw_placement("p", "n", [CardSlice(1, 0, 1)])) == "node n card 1 is unhealthy"


def test_every_change_bumps_the_node_version(state: ClusterState) -> None:
    v0 = int(state.node_version[0])
    book_slice(state, "a", "n0", 0, compute=200)
    v1 = int(state.node_version[0])
    state.release("a")
    v2 = int(state.node_version[0])
    state.set_card_health("n0", 1, False)
    v3 = int(state.node_version[0])
    assert v0 < v1 < v2 < v3
    assert int(state.node_version[1]) < v1  # the other node did not change


def test_upsert_node_rederives_free_from_placements(state: ClusterState) -> None:
    book_slice(state, "a", "n0", 0, compute=300, memory=4_000, cpu=1_000)
    book_whole(state, "w", "n0", 1)
    # the node side restarts and reports larger cards and more CPU: free = new total - held
    bigger = make_node("n0", [32_768, 32_768], cpu=16_000, memory=64_000)
    assert state.upsert_node(bigger) == 0
    assert usage(state, "n0", 0) == (28_768, 700, CardMode.SHARED)
    assert usage(state, "n0", 1) == (0, 0, CardMode.EXCLUSIVE)
    assert int(state.cpu_free[0]) == 15_000
    assert int(state.mem_free[0]) == 64_000
    state.release("w")
    assert usage(state, "n0", 1) == (32_768, 1000, CardMode.IDLE)
    state.release("a")
    assert usage(state, "n0", 0) == (32_768, 1000, CardMode.IDLE)


def test_upsert_node_adds_new_nodes_and_rows_grow() -> None:
    state = ClusterState()
    assert state.size == 0
    for i in range(3):
        assert state.upsert_node(make_node(f"n{i}", i + 1)) == i
    assert state.size == 3
    assert state.total_compute() == 6000
    assert [len(state.card_usage(f"n{i}")) for i in range(3)] == [1, 2, 3]


def test_adding_nodes_one_at_a_time_grows_storage_geometrically() -> None:
    """Each single add used to copy every array (quadratic: seconds for 5,000 nodes); the buffers
    now double, so 2,000 adds reallocate a handful of times, and the public arrays stay exactly
    ``size`` rows long."""
    state = ClusterState()
    buffers = set()
    for i in range(2_000):
        state.upsert_node(make_node(f"n{i}", 2))
        buffers.add(id(state._storage["card_mem_free"]))
        assert len(state.present) == len(state.card_mem_free) == state.size == i + 1
    assert len(buffers) <= 12
    assert state.total_compute() == 4_000 * 1000


def test_add_nodes_matches_one_at_a_time_and_keeps_bookings() -> None:
    one_by_one = ClusterState()
    for i in range(5):
        one_by_one.upsert_node(make_node(f"n{i}", 2))
    bulk = ClusterState()
    assert bulk.add_nodes([make_node(f"n{i}", 2) for i in range(5)]) == [0, 1, 2, 3, 4]
    for name in ClusterState._NODE_ARRAYS + ClusterState._CARD_ARRAYS:
        if name != "node_version":
            np.testing.assert_array_equal(getattr(bulk, name), getattr(one_by_one, name), err_msg=name)
    book_slice(bulk, "a", "n1", 1, compute=300, memory=4_000)
    before = ledger_snapshot(bulk)
    # a later list: one known node again, a wider node (the card columns grow), a duplicate name
    rows = bulk.add_nodes([make_node("n1", 2), make_node("wide", 10), make_node("x", 1), make_node("x", 3)])
    assert rows == [1, 5, 6, 6]
    assert bulk.size == 7 and bulk.max_cards == 10
    assert usage(bulk, "n1", 1) == (12_384, 700, CardMode.SHARED)
    for name, old in before.items():  # the first five rows, in the old width, are untouched
        now = getattr(bulk, name)
        np.testing.assert_array_equal(now[:5, :8] if now.ndim == 2 else now[:5], old, err_msg=name)
    assert len(bulk.card_usage("x")) == 3
    assert bulk.add_nodes([]) == []


def test_capacity_is_memoised_until_the_set_of_nodes_changes(state: ClusterState) -> None:
    first = state.capacity()
    assert (first.has_cards, first.largest_card_mib, first.most_cards) == (True, 16_384, 4)
    book_slice(state, "a", "n1", 0, compute=300)
    assert state.capacity() is first  # bookings do not change it: no scan per request
    state.upsert_node(make_node("big", [32_768] * 6))
    assert (state.capacity().largest_card_mib, state.capacity().most_cards) == (32_768, 6)
    state.remove_node("big")
    assert (state.capacity().largest_card_mib, state.capacity().most_cards) == (16_384, 4)
    state.remove_node("n0")
    state.remove_node("n1")
    assert not state.capacity().has_cards


def test_upsert_node_can_change_the_card_model_and_health() -> None:
    state = ClusterState([make_node("n", 2, model="A")])
    state.upsert_node(make_node("n", 2, model="B", unhealthy=[0]))
    assert state.models == ["A", "B"]
    assert state.card_model[0, :2].tolist() == [1, 1]
    assert state.card_healthy[0, :2].tolist() == [False, True]


def test_remove_node_drops_its_placements(state: ClusterState) -> None:
    a = book_slice(state, "a", "n0", 0, compute=300)
    book_slice(state, "b", "n1", 0, compute=300)
    assert state.remove_node("n0") == [a]
    assert "a" not in state.placements
    assert "b" in state.placements
    assert not state.present[0]
    assert state.total_compute() == 4000
    assert state.allocated_compute() == 300
    assert state.check(raw_placement("c", "n0", [])) == "node n0 is not known"
    assert state.release("a") is None
    assert state.remove_node("n0") == []
    assert state.remove_node("unknown") == []


def test_removed_node_comes_back_empty(state: ClusterState) -> None:
    book_slice(state, "a", "n0", 0, compute=300, cpu=500)
    state.remove_node("n0")
    assert state.upsert_node(make_node("n0", 2, cpu=8_000, memory=32_000)) == 0
    assert state.present[0]
    assert usage(state, "n0", 0) == (16_384, 1000, CardMode.IDLE)
    assert int(state.cpu_free[0]) == 8_000


def test_model_ids_are_stable_and_unknown_models_match_nothing() -> None:
    state = ClusterState([make_node("a", 1, model="T4"), make_node("b", 1, model="V100")])
    assert state.model_id("T4") == 0
    assert state.model_id("V100") == 1
    assert state.model_ids(["V100", "A100", "T4"]) == [1, 0]
    assert state.node_names([1, 0]) == ["b", "a"]


def test_card_usage_is_read_only() -> None:
    state = ClusterState([make_node("n", 1)])
    u = state.card_usage("n")[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        u.memory_free = 0  # type: ignore[misc]
