"""The resource model: request validation, request forms, pod totals, held resources, topology."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpupool.core.model import (
    MAX_CARD_MEMORY_MIB,
    MAX_CARDS_PER_NODE,
    MAX_NODE_CPU_MILLI,
    MAX_NODE_MEMORY_MIB,
    CardSlice,
    ContainerAssignment,
    ContainerRequest,
    GpuCard,
    GpuKind,
    GpuRequest,
    LinkLevel,
    NodeSpec,
    Placement,
    PodRequest,
    Topology,
)

# ------------------------------------------------------------------------------------- GpuCard


def test_card_rejects_negative_capacity() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        GpuCard(index=0, uuid="u", model="A", memory_mib=-1)
    with pytest.raises(ValueError, match="non-negative"):
        GpuCard(index=0, uuid="u", model="A", memory_mib=1, compute=-1)


BIG = 10**30  # a 31-digit memoryMiB, as a broken inventory file once published


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(lambda: GpuCard(index=0, uuid="u", model="A", memory_mib=BIG),
                     r"card 0: memory_mib must be at most 2147483648, got a number of 100 bits", id="card-memory-huge"),
        pytest.param(lambda: GpuCard(index=0, uuid="u", model="A", memory_mib=MAX_CARD_MEMORY_MIB + 1),
                     r"card 0: memory_mib must be at most 2147483648, got 2147483649", id="card-memory-just-over"),
        pytest.param(lambda: GpuCard(index=0, uuid="u", model="A", memory_mib=1, compute=1001),
                     r"card 0: compute must be at most 1000", id="card-compute-over-a-card"),
        pytest.param(lambda: GpuCard(index=MAX_CARDS_PER_NODE, uuid="u", model="A", memory_mib=1),
                     r"card: index must be at most 255", id="card-index"),
        pytest.param(lambda: GpuCard(index=-1, uuid="u", model="A", memory_mib=1),
                     r"card: index must be non-negative", id="card-index-negative"),
        pytest.param(lambda: GpuCard(index=0, uuid="u", model="A", memory_mib=1.5),  # type: ignore[arg-type]
                     r"card 0: memory_mib must be an integer, got float", id="card-memory-float"),
        pytest.param(lambda: GpuCard(index=0, uuid="u", model="A", memory_mib=True),
                     r"card 0: memory_mib must be an integer, got bool", id="card-memory-bool"),
        pytest.param(lambda: GpuCard(index=0, uuid="u", model="A", memory_mib=10**5000),
                     r"memory_mib must be at most 2147483648, got a number of 16610 bits",
                     id="card-memory-5000-digits"),
        pytest.param(lambda: NodeSpec("n", cpu_milli=MAX_NODE_CPU_MILLI + 1, memory_mib=0),
                     r"node n: cpu_milli must be at most", id="node-cpu"),
        pytest.param(lambda: NodeSpec("n", cpu_milli=0, memory_mib=-1),
                     r"node n: memory_mib must be non-negative", id="node-memory-negative"),
        pytest.param(lambda: NodeSpec("n", cpu_milli=0, memory_mib=BIG),
                     r"node n: memory_mib must be at most", id="node-memory-huge"),
        pytest.param(lambda: NodeSpec("n", cpu_milli=0, memory_mib=0,
                                      cards=(GpuCard(0, "u", "A", 1),) * (MAX_CARDS_PER_NODE + 1)),
                     r"node n: cards: 257 cards, at most 256", id="node-too-many-cards"),
        pytest.param(lambda: GpuRequest(compute=0, memory_mib=MAX_CARD_MEMORY_MIB + 1),
                     r"memory per card must be at most 2147483648 MiB", id="request-memory-over-any-card"),
    ],
)
def test_numbers_outside_the_ledgers_bounds_are_refused_with_the_field_named(build: Callable[[], object],
                                                                              message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_largest_accepted_numbers_still_build() -> None:
    card = GpuCard(index=MAX_CARDS_PER_NODE - 1, uuid="u", model="A", memory_mib=MAX_CARD_MEMORY_MIB)
    NodeSpec("n", cpu_milli=MAX_NODE_CPU_MILLI, memory_mib=MAX_NODE_MEMORY_MIB, cards=(card,) * MAX_CARDS_PER_NODE)
    GpuRequest(compute=0, memory_mib=MAX_CARD_MEMORY_MIB)


# ---------------------------------------------------------------------------------- GpuRequest


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"count": 0, "compute": 100}, "at least one card", id="zero-cards"),
        pytest.param({"count": -1, "compute": 100}, "at least one card", id="negative-cards"),
        pytest.param({"compute": -1}, "within 0..1000", id="negative-compute"),
        pytest.param({"compute": 1001}, "within 0..1000", id="compute-over-a-card"),
        pytest.param({"compute": 100, "memory_mib": -1}, "non-negative", id="negative-memory"),
        pytest.param({"compute": 0, "memory_mib": 0}, "memory, compute or both", id="no-amounts"),
    ],
)
def test_gpu_request_validation(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GpuRequest(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        # memory only
        pytest.param({"compute": 0, "memory_mib": 1}, id="memory-only"),
        # compute only
        pytest.param({"compute": 1, "memory_mib": 0}, id="compute-only"),
        pytest.param({"compute": 1000, "memory_mib": None}, id="whole-compute"),
        # exclusive needs no amounts
        pytest.param({"exclusive": True, "compute": 0, "memory_mib": 0}, id="exclusive-without-amounts"),
    ],
)
def test_gpu_request_accepts_valid_forms(kwargs: dict[str, object]) -> None:
    GpuRequest(**kwargs)  # type: ignore[arg-type]


def test_gpu_request_rejects_empty_proportional_request() -> None:
    with pytest.raises(ValueError, match="memory, compute or both"):
        GpuRequest(compute=0, memory_mib=None)


def test_whole_is_exclusive_full_card() -> None:
    request = GpuRequest.whole(3, frozenset({"V100"}))
    assert request == GpuRequest(count=3, compute=1000, memory_mib=None, exclusive=True,
                                 models=frozenset({"V100"}))


@pytest.mark.parametrize(
    ("milli", "count", "expected"),
    [
        pytest.param(300, 1, GpuRequest(count=1, compute=300, memory_mib=None), id="one-slice"),
        pytest.param(999, 2, GpuRequest(count=2, compute=999, memory_mib=None), id="two-slices"),
        pytest.param(1000, 1, GpuRequest.whole(1), id="one-whole-card"),
        pytest.param(1000, 4, GpuRequest.whole(4), id="four-whole-cards"),
        pytest.param(1500, 1, GpuRequest.whole(1), id="over-a-card-is-whole"),
    ],
)
def test_fraction(milli: int, count: int, expected: GpuRequest) -> None:
    assert GpuRequest.fraction(milli, count) == expected


def test_fraction_of_a_whole_card_is_exclusive_and_keeps_models() -> None:
    request = GpuRequest.fraction(1000, 2, frozenset({"T4"}))
    assert request.exclusive
    assert request.models == frozenset({"T4"})


CARD = GpuCard(index=0, uuid="u", model="A", memory_mib=16_276, compute=1000)


@pytest.mark.parametrize(
    ("request_", "memory", "compute"),
    [
        # 16276 * 0.3 = 4882.8, floored
        pytest.param(GpuRequest(compute=300, memory_mib=None), 4882, 300, id="compute-share-floors-memory"),
        pytest.param(GpuRequest(compute=500, memory_mib=None), 8138, 500, id="half-card"),
        pytest.param(GpuRequest(compute=1, memory_mib=None), 16, 1, id="one-per-mille"),
        pytest.param(GpuRequest(compute=0, memory_mib=8138), 8138, 0, id="memory-only"),
        pytest.param(GpuRequest(compute=250, memory_mib=100), 100, 250, id="memory-and-compute"),
        pytest.param(GpuRequest.whole(), 16_276, 1000, id="whole-card"),
    ],
)
def test_memory_and_compute_on_card(request_: GpuRequest, memory: int, compute: int) -> None:
    assert request_.memory_on(CARD) == memory
    assert request_.compute_on(CARD) == compute


def test_proportional_slices_summing_to_a_card_never_exceed_its_memory() -> None:
    card = GpuCard(index=0, uuid="u", model="A", memory_mib=16_277)
    parts = [333, 333, 334]
    assert sum(GpuRequest.fraction(p).memory_on(card) for p in parts) <= card.memory_mib


def test_whole_card_takes_the_card_compute_even_for_virtual_cards() -> None:
    vgpu = GpuCard(index=0, uuid="v", model="A", memory_mib=8_000, compute=500, kind=GpuKind.VIRTUAL)
    assert GpuRequest.whole().compute_on(vgpu) == 500
    assert GpuRequest.whole().memory_on(vgpu) == 8_000


@pytest.mark.parametrize(
    ("models", "kind", "card_model", "card_kind", "allowed"),
    [
        pytest.param(frozenset(), None, "A", GpuKind.PHYSICAL, True, id="any-model"),
        pytest.param(frozenset({"A", "B"}), None, "B", GpuKind.PHYSICAL, True, id="listed-model"),
        pytest.param(frozenset({"A"}), None, "B", GpuKind.PHYSICAL, False, id="unlisted-model"),
        pytest.param(frozenset(), GpuKind.VIRTUAL, "A", GpuKind.PHYSICAL, False, id="virtual-wanted-physical-card"),
        pytest.param(frozenset(), GpuKind.VIRTUAL, "A", GpuKind.VIRTUAL, True, id="virtual-wanted-virtual-card"),
        pytest.param(frozenset({"A"}), GpuKind.PHYSICAL, "A", GpuKind.PHYSICAL, True, id="model-and-kind-match"),
    ],
)
def test_allows(models: frozenset[str], kind: GpuKind | None, card_model: str, card_kind: GpuKind,
                allowed: bool) -> None:
    request = GpuRequest(compute=100, models=models, kind=kind)
    assert request.allows(GpuCard(index=0, uuid="u", model=card_model, memory_mib=1, kind=card_kind)) is allowed


# ---------------------------------------------------------------------------------- PodRequest


def _c(name: str, cpu: int, mem: int, gpu: GpuRequest | None = None) -> ContainerRequest:
    return ContainerRequest(name, cpu_milli=cpu, memory_mib=mem, gpu=gpu)


@pytest.mark.parametrize(
    ("apps", "inits", "cpu", "memory"),
    [
        pytest.param([(1000, 100)], [], 1000, 100, id="one-app"),
        pytest.param([(1000, 100), (500, 300)], [], 1500, 400, id="two-apps-sum"),
        # app sum wins
        pytest.param([(1000, 100), (500, 300)], [(1200, 50)], 1500, 400, id="app-sum-beats-init"),
        # init CPU wins, app memory wins
        pytest.param([(1000, 100), (500, 300)], [(2000, 50)], 2000, 400, id="init-cpu-beats-apps"),
        # largest init, not the init sum
        pytest.param([(1000, 100)], [(200, 900), (300, 700)], 1000, 900, id="largest-init-not-init-sum"),
        pytest.param([], [], 0, 0, id="no-containers"),
    ],
)
def test_pod_cpu_and_memory_follow_the_init_container_max_rule(
        apps: list[tuple[int, int]], inits: list[tuple[int, int]], cpu: int, memory: int) -> None:
    pod = PodRequest(key="p", containers=tuple(_c(f"a{i}", *a) for i, a in enumerate(apps)),
                     init_containers=tuple(_c(f"i{i}", *x) for i, x in enumerate(inits)))
    assert pod.cpu_milli == cpu
    assert pod.memory_mib == memory


def test_pod_gpu_views() -> None:
    pod = PodRequest(
        key="p",
        containers=(_c("a", 1, 1, GpuRequest.fraction(300)), _c("b", 1, 1),
                    _c("c", 1, 1, GpuRequest.whole(2))),
        init_containers=(_c("i", 1, 1, GpuRequest.fraction(900)),),
    )
    assert [c.name for c in pod.gpu_containers] == ["a", "c"]
    assert pod.wants_gpu
    # init containers are not part of the trace's demand
    assert pod.gpu_milli_total() == 300 + 2000


def test_pod_without_gpus() -> None:
    pod = PodRequest(key="p", containers=(_c("a", 1, 1),))
    assert not pod.wants_gpu
    assert pod.gpu_milli_total() == 0
    init_only = PodRequest(key="p", containers=(_c("a", 1, 1),),
                           init_containers=(_c("i", 1, 1, GpuRequest.fraction(100)),))
    assert init_only.wants_gpu
    assert init_only.gpu_milli_total() == 0


def test_gpu_milli_total_counts_every_card_of_a_multi_card_slice() -> None:
    pod = PodRequest(key="p", containers=(_c("a", 1, 1, GpuRequest(count=3, compute=200)),))
    assert pod.gpu_milli_total() == 600


# ----------------------------------------------------------------------------------- Placement


def _assign(name: str, *slices: CardSlice, init: bool = False) -> ContainerAssignment:
    return ContainerAssignment(name, tuple(slices), init=init)


def test_held_per_card_sums_app_containers() -> None:
    placement = Placement("p", "n", 0, 0, (
        _assign("a", CardSlice(0, 1000, 200), CardSlice(1, 500, 100)),
        _assign("b", CardSlice(0, 3000, 300)),
    ))
    assert placement.held_per_card() == {0: (4000, 500, False), 1: (500, 100, False)}


def test_held_per_card_takes_the_max_of_app_total_and_each_init_container() -> None:
    placement = Placement("p", "n", 0, 0, (
        _assign("a", CardSlice(0, 1000, 200)),
        _assign("b", CardSlice(0, 1000, 200)),
        _assign("i1", CardSlice(0, 1500, 100), init=True),   # memory above app total, compute below
        _assign("i2", CardSlice(0, 500, 350), init=True),    # compute above app total
        _assign("i3", CardSlice(2, 700, 70), init=True),     # a card only an init container uses
    ))
    assert placement.held_per_card() == {0: (2000, 400, False), 2: (700, 70, False)}


def test_held_per_card_marks_exclusive_cards_from_app_or_init() -> None:
    placement = Placement("p", "n", 0, 0, (
        _assign("a", CardSlice(0, 16_000, 1000, exclusive=True), CardSlice(1, 100, 10)),
        _assign("i", CardSlice(2, 16_000, 1000, exclusive=True), init=True),
    ))
    held = placement.held_per_card()
    assert held[0] == (16_000, 1000, True)
    assert held[1] == (100, 10, False)
    assert held[2] == (16_000, 1000, True)


def test_container_assignment_cards_keep_order() -> None:
    assert _assign("a", CardSlice(3, 1, 1), CardSlice(1, 1, 1)).cards == (3, 1)


# ------------------------------------------------------------------------------------ Topology

S, NV, SW, HB, SY = LinkLevel.SELF, LinkLevel.NVLINK, LinkLevel.PCIE_SWITCH, LinkLevel.HOST_BRIDGE, LinkLevel.SYSTEM


def test_from_tree_two_levels_meet_at_host_bridge() -> None:
    topo = Topology.from_tree([[0, 1], [2, 3]], 4)
    assert topo.levels == (
        (S, SW, HB, HB),
        (SW, S, HB, HB),
        (HB, HB, S, SW),
        (HB, HB, SW, S),
    )


def test_from_tree_three_levels_sockets_meet_at_system() -> None:
    topo = Topology.from_tree([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], 8)
    expected = {
        (0, 1): SW, (2, 3): SW, (4, 5): SW, (6, 7): SW,
        (0, 2): HB, (1, 3): HB, (4, 6): HB, (5, 7): HB,
        (0, 4): SY, (3, 4): SY, (1, 7): SY,
    }
    for (a, b), level in expected.items():
        assert topo.link(a, b) == level
        assert topo.link(b, a) == level
    for i in range(8):
        assert topo.link(i, i) == S


def test_topology_is_symmetric() -> None:
    topo = Topology.from_tree([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], 8)
    for a in range(8):
        for b in range(8):
            assert topo.levels[a][b] == topo.levels[b][a]


def test_flat_and_unknown_links() -> None:
    topo = Topology.flat(3, LinkLevel.NUMA_NODE)
    assert topo.link(0, 2) == LinkLevel.NUMA_NODE
    assert topo.link(1, 1) == S
    assert topo.link(0, 7) == SY  # outside the matrix: unknown means far


def test_node_link_defaults_to_flat_system() -> None:
    node = NodeSpec("n", 1, 1, cards=tuple(GpuCard(i, f"u{i}", "A", 1) for i in range(2)))
    assert node.link(0, 1) == SY
    node = NodeSpec("n", 1, 1, cards=node.cards, topology=Topology(((S, NV), (NV, S))))
    assert node.link(0, 1) == NV


def test_held_per_card_is_worked_out_once_and_read_only() -> None:
    placement = Placement("p", "n", 0, 0, (_assign("a", CardSlice(0, 4000, 500)),))
    held = placement.held_per_card()
    assert placement.held_per_card() is held
    with pytest.raises(TypeError):
        held[1] = (0, 0, False)  # type: ignore[index]
