"""The allocation mapper on its own: each rule of docs/allocate-mapping.md on a hand-made snapshot.

The load tests (test_allocate_mapping.py) drive it through gRPC and the fake kubelet; these pin
down one rule each, so a regression names the rule it broke.
"""

from __future__ import annotations

import pytest

from gpupool.api.names import ResourceNames
from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.nodeagent.allocation_mapper import AllocationMapper, MappingError
from gpupool.nodeagent.types import ContainerView, NodeAssignment, PodResourcesSnapshot, PodView

NAMES = ResourceNames()
MEM, CORE = NAMES.gpu_mem, NAMES.gpu_core


SIDECAR = "sidecar"
"""The ``init`` of a native sidecar in :func:`pod`: an init container with ``restartPolicy: Always``."""


def pod(name: str, *containers: tuple[str, bool | str, int, int], card: int = 0, created: float = 0.0,
        assigned: bool = True, terminated: bool = False, node: str = "n1") -> PodView:
    """A pod whose containers (name, init, gpu-mem units, card) each hold one slice on ``card``;
    ``init`` is :data:`SIDECAR` for a native sidecar (the extender books it as an app container)."""
    views = tuple(ContainerView(c, bool(init), {MEM: units, CORE: 10}, restartable=init == SIDECAR)
                  for c, init, units, _ in containers)
    placement = Placement(f"ns/{name}", node, 0, 0, tuple(
        ContainerAssignment(c, (CardSlice(slice_card, units * 256, 100),), init=init is True)
        for c, init, units, slice_card in containers))
    return PodView("ns", name, f"uid-{name}", node, created, terminated, views,
                   NodeAssignment(placement, {}) if assigned else None,
                   "" if assigned else "assignment-v1: missing field 'node'")


def listed(*pods: PodView, devices: dict[tuple[str, str], dict[str, frozenset[str]]] | None = None
           ) -> PodResourcesSnapshot:
    """PodResources as kubelet lists them: every pod, its native sidecars and app containers with
    their device IDs (regular init containers are not listed)."""
    devices = devices or {}
    return {p.key: {c.name: devices.get((p.name, c.name), {}) for c in p.containers if c.listed} for p in pods}


def views(*pods: PodView) -> dict[tuple[str, str], PodView]:
    return {p.key: p for p in pods}


def observed(*pods: PodView) -> tuple[AllocationMapper, PodResourcesSnapshot]:
    """A mapper on node n1 that has seen kubelet list ``pods`` (no devices yet), and that listing."""
    mapper = AllocationMapper("n1")
    snap = listed(*pods)
    mapper.observe(snap, views(*pods))
    return mapper, snap


def test_one_waiting_container_is_unique() -> None:
    a = pod("a", ("main", False, 16, 1))
    mapper, snap = observed(a)
    res = mapper.resolve(MEM, 16, snap, views(a))
    assert (res.pod.name, res.container.name, res.basis, res.assignment.cards) == ("a", "main", "unique", (1,))


def test_init_then_app_in_spec_order() -> None:
    a = pod("a", ("warmup", True, 4, 0), ("main", False, 4, 0))
    mapper, snap = observed(a)
    first = mapper.resolve(MEM, 4, snap, views(a))
    assert first.container.name == "warmup"
    mapper.record(first, MEM, frozenset({"g0-m0"}), ("GPU-a",))
    assert mapper.resolve(MEM, 4, snap, views(a)).container.name == "main"


def test_app_container_with_devices_in_podresources_is_served() -> None:
    a = pod("a", ("main", False, 4, 0), ("side", False, 4, 0))
    snap = listed(a, devices={("a", "main"): {MEM: frozenset({"g0-m1"})}})
    mapper = AllocationMapper("n1")
    mapper.observe(snap, views(a))
    assert mapper.resolve(MEM, 4, snap, views(a)).container.name == "side"


def test_a_native_sidecar_is_allocated_in_init_order_before_the_app_containers() -> None:
    a = pod("a", ("warmup", True, 4, 0), ("side", SIDECAR, 2, 0), ("main", False, 4, 0))
    mapper, snap = observed(a)
    order: list[str] = []
    for _ in range(3):
        res = mapper.resolve(MEM, 4 if len(order) != 1 else 2, snap, views(a))
        order.append(res.container.name)
        mapper.record(res, MEM, frozenset({f"g0-m{len(order)}"}), ("GPU-a",))
    assert order == ["warmup", "side", "main"]


def test_a_sidecar_half_allocated_is_still_the_next_container() -> None:
    """kubelet records a container's devices resource by resource, each once its Allocate returned,
    and lists a native sidecar with them: the sidecar's first resource in PodResources does not
    make its second one (nor the app containers' turn) come later."""
    a = pod("a", ("side", SIDECAR, 4, 0), ("main", False, 4, 0))
    mapper = AllocationMapper("n1")
    snap = listed(a, devices={("a", "side"): {CORE: frozenset({"g0-c1"})}})  # gpu-core done, gpu-mem next
    mapper.observe(snap, views(a))
    assert mapper.resolve(MEM, 4, snap, views(a)).container.name == "side"


def test_a_sidecars_devices_do_not_mean_the_later_init_containers_are_done() -> None:
    """A native sidecar may come before a regular init container: its devices in PodResources say
    only that the containers before it are done."""
    a = pod("a", ("side", SIDECAR, 2, 0), ("migrate", True, 4, 0), ("main", False, 4, 0))
    snap = listed(a, devices={("a", "side"): {MEM: frozenset({"g0-m0", "g0-m1"})}})
    mapper = AllocationMapper("n1")  # an agent restarted since it served "side"
    mapper.observe(snap, views(a))
    assert mapper.resolve(MEM, 4, snap, views(a)).container.name == "migrate"


def test_devices_of_a_later_container_mean_the_earlier_ones_are_done() -> None:
    """After an agent restart (no served log, no ``allocated-v1`` yet): a regular init container and
    a sidecar before an app container kubelet lists with devices are served."""
    a = pod("a", ("warmup", True, 4, 0), ("side", SIDECAR, 4, 0), ("main", False, 4, 0), ("tail", False, 4, 0))
    snap = listed(a, devices={("a", "main"): {CORE: frozenset({"g0-c0"})}})
    mapper = AllocationMapper("n1")
    mapper.observe(snap, views(a))
    assert mapper.resolve(MEM, 4, snap, views(a)).container.name == "main"


def test_the_pod_that_appeared_last_is_the_one_being_admitted() -> None:
    old, new = pod("old", ("main", False, 8, 0)), pod("new", ("main", False, 8, 1))
    mapper = AllocationMapper("n1")
    mapper.observe(listed(old), views(old))  # kubelet listed "old" first (G1: its admission is over)
    snap = listed(old, new)
    mapper.observe(snap, views(old, new))
    res = mapper.resolve(MEM, 8, snap, views(old, new))
    assert (res.pod.name, res.basis, res.candidates) == ("new", "newest", 2)


def test_same_snapshot_tie_goes_to_the_later_created_pod() -> None:
    a, b = pod("a", ("main", False, 8, 0), created=1.0), pod("b", ("main", False, 8, 1), created=2.0)
    mapper, snap = observed(a, b)
    res = mapper.resolve(MEM, 8, snap, views(a, b))
    assert (res.pod.name, res.basis) == ("b", "created")


@pytest.mark.parametrize(
    ("p", "size", "fragment"),
    [
        pytest.param(pod("a", ("main", False, 8, 0)), 4, "ns/a/main wants 8", id="wants-more-than-offered"),
        pytest.param(
            pod("a", ("main", False, 4, 0), assigned=False), 4, "ns/a has no readable assignment assignment-v1",
            id="no-readable-assignment",
        ),
        pytest.param(
            pod("a", ("main", False, 4, 0), node="n2"), 4, "is not assigned cards on n1",
            id="assigned-to-another-node",
        ),
        pytest.param(
            pod("a", ("main", False, 4, 0), terminated=True), 4, "no listed pod waits for it",
            id="terminated-pod",
        ),
    ],
)
def test_no_match_is_refused_with_what_was_considered(p: PodView, size: int, fragment: str) -> None:
    mapper, snap = observed(p)
    with pytest.raises(MappingError, match=fragment):
        mapper.resolve(MEM, size, snap, views(p))


def test_devices_recorded_under_another_container_are_a_mismatch() -> None:
    a, b = pod("a", ("main", False, 8, 0), created=1.0), pod("b", ("main", False, 8, 1), created=2.0)
    mapper, snap = observed(a, b)
    res = mapper.resolve(MEM, 8, snap, views(a, b))
    assert res.pod.name == "b"
    ids = frozenset({"g1-m0"})
    mapper.record(res, MEM, ids, ("GPU-b",))
    # kubelet says "a" holds the IDs served to "b": "a" is who really got that grant.
    [mismatch] = mapper.mismatches(listed(a, b, devices={("a", "main"): {MEM: ids}}))
    assert mismatch.record.pod_key == ("ns", "b") and mismatch.holder == ("ns", "a")
    assert mapper.mismatches(listed(a, b, devices={("b", "main"): {MEM: ids}})) == []


def test_a_sidecars_devices_recorded_under_another_container_are_a_mismatch() -> None:
    """PodResources lists native sidecars and never hands their IDs to a later container, so a
    sidecar's grant is reconciled like an app container's (a regular init container's is not: its
    IDs may be reused by the app containers of its pod)."""
    a, b = pod("a", ("side", SIDECAR, 8, 0)), pod("b", ("main", False, 8, 1))
    mapper, snap = observed(a)
    res = mapper.resolve(MEM, 8, snap, views(a))
    assert res.container.name == "side"
    ids = frozenset({"g0-m0"})
    mapper.record(res, MEM, ids, ("GPU-a",))
    [mismatch] = mapper.mismatches(listed(a, b, devices={("b", "main"): {MEM: ids}}))
    assert (mismatch.record.container, mismatch.holder, mismatch.holder_container) == ("side", ("ns", "b"), "main")
    assert mapper.mismatches(listed(a, b, devices={("a", "side"): {MEM: ids}})) == []


def test_pods_gone_from_kubelet_are_forgotten_after_a_while() -> None:
    now = [0.0]
    a = pod("a", ("main", False, 8, 0))
    mapper = AllocationMapper("n1", clock=lambda: now[0], forget_after_s=60)
    snap = listed(a)
    mapper.observe(snap, views(a))
    mapper.record(mapper.resolve(MEM, 8, snap, views(a)), MEM, frozenset({"g0-m0"}), ("GPU-a",))
    mapper.observe({}, {})
    now[0] = 30.0
    mapper.observe({}, {})
    assert len(mapper.served()) == 1
    now[0] = 61.0
    mapper.observe({}, {})
    assert mapper.served() == []
