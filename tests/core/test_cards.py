"""Card choice on one node: Tencent GPUManager's three cases, multi-container and init containers."""

from __future__ import annotations

import pytest

from gpupool.core.cards import NodeScratch, assign_on_node, best_fit_card, cheapest_card_set, most_isolated_card
from gpupool.core.model import ContainerRequest, GpuRequest, LinkLevel, Placement, PodRequest, Topology
from gpupool.core.state import ClusterState
from tests.core.builders import book_slice, book_whole, make_node, pod_with, slice_pod

# Two sockets; each socket has one host bridge with two PCIe switches of two cards.
TREE = Topology.from_tree([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], 8)


def tree_state(*, exclusive: tuple[int, ...] = (), shared: dict[int, int] | None = None) -> ClusterState:
    state = ClusterState([make_node("n", 8, topology=TREE)])
    for card in exclusive:
        book_whole(state, f"busy-{card}", "n", card)
    for card, compute in (shared or {}).items():
        book_slice(state, f"share-{card}", "n", card, compute=compute)
    return state


def cards_of(result: Placement | str, container: str = "main") -> tuple[int, ...]:
    assert isinstance(result, Placement), result
    for assignment in result.containers:
        if assignment.container == container:
            return tuple(sorted(assignment.cards))
    raise AssertionError(f"no container {container}")


# ----------------------------------------------------------------------- more than one card


@pytest.mark.parametrize(
    ("count", "exclusive", "expected"),
    [
        pytest.param(2, (), (0, 1), id="pair-on-an-idle-node"),
        # not (1, 2): 1 and 2 meet only at the host bridge
        pytest.param(2, (0,), (2, 3), id="pair-skips-a-broken-switch"),
        # 1 and 3 are orphans of their switches
        pytest.param(2, (0, 2), (4, 5), id="pair-skips-two-orphans"),
        # every pair is broken; the host bridge beats crossing sockets
        pytest.param(2, (0, 2, 4, 6), (1, 3), id="pair-over-the-host-bridge"),
        pytest.param(4, (), (0, 1, 2, 3), id="four-on-an-idle-node"),
        # one host-bridge half, never straddling the sockets
        pytest.param(4, (0,), (4, 5, 6, 7), id="four-on-the-intact-half"),
        pytest.param(4, (5,), (0, 1, 2, 3), id="four-beside-a-busy-card"),
        # 4 + 4 + 2, as (4, 5, 6); ties go to the lowest indices
        pytest.param(3, (0,), (1, 2, 3), id="three-on-one-socket"),
        pytest.param(8, (), tuple(range(8)), id="eight-whole-node"),
    ],
)
def test_multi_card_whole_requests_take_the_cheapest_link_set(count: int, exclusive: tuple[int, ...],
                                                               expected: tuple[int, ...]) -> None:
    state = tree_state(exclusive=exclusive)
    assert cards_of(assign_on_node(state, 0, slice_pod("p", 1000, count=count))) == expected


def test_cheapest_card_set_costs() -> None:
    spec = make_node("n", 8, topology=TREE)
    # {1, 2, 3}: links 4 + 4 + 2 = 10; {4, 5, 6}: 2 + 4 + 4 = 10 -> tie goes to the lowest indices
    assert cheapest_card_set(spec, [1, 2, 3, 4, 5, 6, 7], 3) == [1, 2, 3]
    assert cheapest_card_set(spec, [1, 3, 5, 7], 2) == [1, 3]
    assert cheapest_card_set(spec, [3, 5], 2) == [3, 5]


def test_cheapest_card_set_tiebreak_prefers_fuller_cards_for_slices() -> None:
    spec = make_node("n", 4, topology=Topology.from_tree([[0, 1], [2, 3]], 4))
    free = {0: 1000, 1: 1000, 2: 400, 3: 500}
    assert cheapest_card_set(spec, [0, 1, 2, 3], 2, tiebreak=free.__getitem__) == [2, 3]


def test_multi_card_slices_prefer_a_linked_pair_then_fuller_cards() -> None:
    state = ClusterState([make_node("n", 4, topology=Topology.from_tree([[0, 1], [2, 3]], 4))])
    book_slice(state, "x", "n", 3, compute=400)
    book_slice(state, "y", "n", 1, compute=100)
    # pairs (0, 1) and (2, 3) both cost PCIE_SWITCH; (2, 3) has less free compute
    assert cards_of(assign_on_node(state, 0, slice_pod("p", 300, count=2))) == (2, 3)


def test_large_nodes_fall_back_to_greedy_but_stay_on_one_switch() -> None:
    groups = [[[4 * s + 2 * w, 4 * s + 2 * w + 1] for w in range(2)] for s in range(4)]
    topo = Topology.from_tree(groups, 16)  # 16 cards: C(16, 8) = 12870 sets, above the exhaustive limit
    spec = make_node("n", 16, topology=topo)
    chosen = cheapest_card_set(spec, list(range(16)), 8)
    assert len(chosen) == 8
    cost = sum(int(spec.link(a, b)) for i, a in enumerate(chosen) for b in chosen[i + 1:])
    # best: two full sockets (4 cards each): within a socket 2 * 2 + 4 * 4 = 20, twice, plus 16 * 6
    assert cost == 2 * 20 + 16 * int(LinkLevel.SYSTEM)


# ---------------------------------------------------------------------- exactly one whole card


@pytest.mark.parametrize(
    ("exclusive", "expected"),
    [
        # 5 lost its switch partner: use it, keep the intact pairs
        pytest.param((4,), 5, id="orphan-of-its-switch"),
        # 1 and 7 are both orphans; lowest index
        pytest.param((0, 6), 1, id="lowest-of-two-orphans"),
        # 3 is alone on its host bridge
        pytest.param((0, 1, 2), 3, id="alone-on-a-host-bridge"),
        # 0 is alone on its socket
        pytest.param((1, 2, 3, 4), 0, id="alone-on-a-socket"),
        # nothing isolated: lowest index
        pytest.param((), 0, id="nothing-isolated"),
    ],
)
def test_one_whole_card_takes_the_most_isolated_idle_card(exclusive: tuple[int, ...], expected: int) -> None:
    state = tree_state(exclusive=exclusive)
    assert cards_of(assign_on_node(state, 0, slice_pod("p", 1000))) == (expected,)


def test_shared_cards_do_not_count_as_idle_partners() -> None:
    # card 6 is shared: 7 is an orphan for whole-card purposes
    state = tree_state(shared={6: 100})
    assert cards_of(assign_on_node(state, 0, slice_pod("p", 1000))) == (7,)


def test_most_isolated_card_direct() -> None:
    spec = make_node("n", 8, topology=TREE)
    assert most_isolated_card(spec, [0, 1, 2, 5]) == 5
    assert most_isolated_card(spec, [3]) == 3


# ------------------------------------------------------------------------ less than one card


@pytest.mark.parametrize(
    ("used", "milli", "expected"),
    [
        pytest.param({}, 300, 0, id="empty-node"),
        # tightest card that holds it
        pytest.param({1: 500, 2: 200}, 300, 1, id="tightest-that-fits"),
        # card 1 is too full now
        pytest.param({1: 500, 2: 200}, 600, 2, id="next-when-full"),
        # ties on compute: lowest index
        pytest.param({1: 800, 2: 700, 3: 700}, 300, 2, id="compute-tie-lowest-index"),
        pytest.param({0: 900, 1: 900, 2: 900, 3: 900}, 200, 4, id="only-the-idle-card"),
    ],
)
def test_slice_goes_to_the_tightest_card(used: dict[int, int], milli: int, expected: int) -> None:
    state = tree_state(shared=used)
    assert cards_of(assign_on_node(state, 0, slice_pod("p", milli))) == (expected,)


def test_best_fit_breaks_compute_ties_by_free_memory() -> None:
    state = ClusterState([make_node("n", 3)])
    book_slice(state, "a", "n", 0, compute=500, memory=1_000)
    book_slice(state, "b", "n", 1, compute=500, memory=4_000)
    book_slice(state, "c", "n", 2, compute=400)
    assert cards_of(assign_on_node(state, 0, pod_with("p", GpuRequest(compute=100, memory_mib=10)))) == (1,)


def test_best_fit_card_direct() -> None:
    state = ClusterState([make_node("n", 3)])
    book_slice(state, "a", "n", 2, compute=600)
    scratch = NodeScratch.of(state, 0)
    mask = scratch.fits(state, GpuRequest.fraction(300))
    assert mask[:3].tolist() == [True, True, True]
    assert best_fit_card(state, scratch, GpuRequest.fraction(300), mask) == 2


def test_slice_memory_is_proportional_to_the_chosen_card() -> None:
    state = ClusterState([make_node("n", [16_384, 32_768])])
    book_slice(state, "a", "n", 1, compute=100)
    placement = assign_on_node(state, 0, slice_pod("p", 250))
    assert isinstance(placement, Placement)
    (slc,) = placement.containers[0].slices
    assert (slc.card, slc.memory_mib, slc.compute, slc.exclusive) == (1, 8_192, 250, False)


def test_whole_card_slices_hold_the_full_card() -> None:
    state = ClusterState([make_node("n", [16_384, 32_768])])
    placement = assign_on_node(state, 0, slice_pod("p", 1000, count=2))
    assert isinstance(placement, Placement)
    got = sorted((s.card, s.memory_mib, s.compute, s.exclusive) for s in placement.containers[0].slices)
    assert got == [(0, 16_384, 1000, True), (1, 32_768, 1000, True)]


# --------------------------------------------------------------- multi-container and init containers


def _pod(containers: list[tuple[str, GpuRequest | None]], inits: list[tuple[str, GpuRequest | None]] = (),
         cpu: int = 100) -> PodRequest:
    return PodRequest(
        key="p",
        containers=tuple(ContainerRequest(n, cpu_milli=cpu, memory_mib=10, gpu=g) for n, g in containers),
        init_containers=tuple(ContainerRequest(n, cpu_milli=cpu, memory_mib=10, gpu=g) for n, g in inits),
    )


def test_containers_never_take_a_card_another_container_needs() -> None:
    state = ClusterState([make_node("n", 2)])
    pod = _pod([("small", GpuRequest.fraction(600)), ("big", GpuRequest.fraction(600))])
    result = assign_on_node(state, 0, pod)
    assert {cards_of(result, "small"), cards_of(result, "big")} == {(0,), (1,)}
    assert state.check(result) is None  # type: ignore[arg-type]


def test_small_slices_of_one_pod_share_a_card() -> None:
    state = ClusterState([make_node("n", 2)])
    result = assign_on_node(state, 0, _pod([("a", GpuRequest.fraction(300)), ("b", GpuRequest.fraction(300))]))
    assert cards_of(result, "a") == cards_of(result, "b") == (0,)
    assert isinstance(result, Placement)
    assert result.held_per_card()[0][1] == 600


def test_whole_cards_are_placed_before_slices() -> None:
    # spec order puts the slice first; placed first it would take card 0 (best fit among idle cards,
    # lowest index) and leave the pair request only (1, 3) across the host bridge
    state = ClusterState([make_node("n", 4, topology=Topology.from_tree([[0, 1], [2, 3]], 4))])
    book_whole(state, "w", "n", 2)
    pod = _pod([("slice", GpuRequest.fraction(500)), ("pair", GpuRequest.whole(2))])
    result = assign_on_node(state, 0, pod)
    assert cards_of(result, "pair") == (0, 1)
    assert cards_of(result, "slice") == (3,)
    assert isinstance(result, Placement)
    assert [c.container for c in result.containers] == ["slice", "pair"]  # spec order kept


def test_pod_fails_when_containers_together_need_too_many_cards() -> None:
    state = ClusterState([make_node("n", 2)])
    result = assign_on_node(state, 0, _pod([("a", GpuRequest.whole()), ("b", GpuRequest.fraction(600)),
                                            ("c", GpuRequest.fraction(600))]))
    assert result == "the cards left on node n cannot hold container c"


def test_init_container_uses_the_app_cards_and_is_accounted_as_max() -> None:
    # one card of 1000: app 600 + init 600 would not fit as a sum, but init runs before the app
    state = ClusterState([make_node("n", 1)])
    pod = _pod([("app", GpuRequest.fraction(600))], [("init", GpuRequest.fraction(600))])
    result = assign_on_node(state, 0, pod)
    assert isinstance(result, Placement)
    assert cards_of(result, "init") == cards_of(result, "app") == (0,)
    assert [c.init for c in result.containers] == [False, True]
    state.apply(result)
    assert state.card_usage("n")[0].compute_free == 400


def test_init_container_prefers_app_cards_over_a_tighter_card() -> None:
    state = ClusterState([make_node("n", 3)])
    book_slice(state, "x", "n", 2, compute=700)  # the best fit for a 300 slice on its own
    pod = _pod([("app", GpuRequest.fraction(800))], [("init", GpuRequest.fraction(300))])
    result = assign_on_node(state, 0, pod)
    assert cards_of(result, "app") == (0,)
    assert cards_of(result, "init") == (0,)


def test_init_container_alone_on_a_card_is_held_too() -> None:
    state = ClusterState([make_node("n", 2)])
    book_slice(state, "x", "n", 0, compute=500)
    pod = _pod([("app", GpuRequest.fraction(500))], [("init", GpuRequest.fraction(600))])
    result = assign_on_node(state, 0, pod)
    assert cards_of(result, "app") == (0,)
    assert cards_of(result, "init") == (1,)  # card 0 has only 500 left before the pod
    assert isinstance(result, Placement)
    assert {c: h[1] for c, h in result.held_per_card().items()} == {0: 500, 1: 600}


def test_assign_on_node_reasons() -> None:
    state = ClusterState([make_node("n", 1, cpu=1_000, memory=1_000)])
    assert assign_on_node(state, 0, slice_pod("p", 100, cpu=2_000)) == (
        "insufficient CPU: 2000m requested, 1000m free")
    assert assign_on_node(state, 0, slice_pod("p", 100, memory=2_000)) == (
        "insufficient memory: 2000 MiB requested, 1000 MiB free")
    assert assign_on_node(state, 0, slice_pod("p", 1000, count=2, memory=10)) == (
        "needs 2 idle whole card(s); 1 idle")
    state.remove_node("n")
    assert assign_on_node(state, 0, slice_pod("p", 100)) == "node n is not known to gpupool"


def test_assign_on_node_books_nothing() -> None:
    state = ClusterState([make_node("n", 2)])
    before = state.card_compute_free.copy()
    assert isinstance(assign_on_node(state, 0, slice_pod("p", 1000, count=2)), Placement)
    assert (state.card_compute_free == before).all()
    assert state.placements == {}
