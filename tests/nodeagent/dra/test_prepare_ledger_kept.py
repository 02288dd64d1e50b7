"""The ledger a DRA prepare is checked against is kept between prepares (issue 24, prepare latency):
every verdict must stay the one a ledger rebuilt on every call gives (the core's card rule beside
the device plugin's pods and the claims prepared already), through random sequences of prepares,
unprepares, changes of the device plugin's pods and of a card's health. The kept ledger's own rules
(the one class the device plugin's Allocate keeps too): ``tests/nodeagent/test_kept_ledger.py``."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, Placement, Topology
from gpupool.nodeagent.dra.cdi import CdiSpecs
from gpupool.nodeagent.dra.claim_allocation import ClaimError, ClaimRef, read_allocation
from gpupool.nodeagent.dra.claim_state import ClaimState
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.kept_ledger import KeptLedger
from gpupool.nodeagent.types import NodeAssignment, PodView
from tests.nodeagent.dra.test_one_ledger_agrees import DRIVER, NODE, claim

CARDS = (GpuCard(1, "GPU-1", "A100", 16384), GpuCard(4, "GPU-4", "A100", 8192))


def inventory_of(cards: tuple[GpuCard, ...]) -> GpuInventory:
    return GpuInventory(cards, Topology.flat(len(cards)), tuple(f"/dev/nvidia{c.index}" for c in cards))


def plugin_pod(name: str, index: int, memory: int, compute: int) -> PodView:
    """A device plugin pod holding ``memory`` MiB and ``compute`` per mille of card ``index``."""
    slices = (CardSlice(index, memory, compute),)
    placement = Placement(f"default/{name}", NODE, 0, 0, (ContainerAssignment("c0", slices),))
    return PodView("default", name, f"uid-{name}", NODE, 0.0, False, (), NodeAssignment(placement, {}))


class Node:
    """A ClaimState whose inventory, device plugin pods and API claims a test changes."""

    def __init__(self, directory: str) -> None:
        self.cards: tuple[GpuCard, ...] = CARDS
        self.plugin: list[PodView] = []
        self.objects: dict[str, dict[str, Any]] = {}
        self.state = ClaimState(NODE, DRIVER, lambda: inventory_of(self.cards), self.read,
                                CdiSpecs(f"{directory}/cdi", "gpupool.io"), f"{directory}/checkpoint.json",
                                held_elsewhere=lambda: list(self.plugin))

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get(name)

    def rebuilt_verdict(self, obj: dict[str, Any]) -> str | None:
        """``obj``'s verdict on a ledger built afresh, as check_fits built it on every call before."""
        kept, self.state.held = self.state.held, KeptLedger(NODE)
        try:
            return self.verdict(obj)
        finally:
            self.state.held = kept

    def verdict(self, obj: dict[str, Any]) -> str | None:
        meta = obj["metadata"]
        ref = ClaimRef(meta["namespace"], meta["name"], meta["uid"])
        try:
            self.state.check_fits(read_allocation(ref, obj, DRIVER, NODE))
        except ClaimError as exc:
            return str(exc)
        return None

    def prepare(self, obj: dict[str, Any]) -> str | None:
        """Prepare ``obj`` through kubelet's call; its refusal, or None."""
        meta = obj["metadata"]
        self.objects[meta["name"]] = obj
        ref = ClaimRef(meta["namespace"], meta["name"], meta["uid"])
        out = asyncio.run(self.state.prepare([ref]))[ref.uid]
        return out if isinstance(out, str) else None

    def unprepare(self, name: str) -> None:
        ref = ClaimRef("ns", name, f"uid-{name}")
        assert asyncio.run(self.state.unprepare([ref])) == {ref.uid: ""}


share = st.tuples(st.sampled_from([1, 4, 7]), st.sampled_from([None, 1024, 4096, 6144]), st.sampled_from([0, 10, 60]))
step: st.SearchStrategy[tuple[str, int, list[Any]]] = st.one_of(
    st.tuples(st.just("prepare"), st.integers(0, 5), st.lists(share, min_size=1, max_size=2)),
    st.tuples(st.just("unprepare"), st.integers(0, 5), st.just([])),
    st.tuples(st.just("plugin+"), st.integers(0, 2), st.lists(share, min_size=1, max_size=1)),
    st.tuples(st.just("plugin-"), st.integers(0, 2), st.just([])),
    st.tuples(st.just("health"), st.integers(0, 1), st.just([])),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=25), st.lists(share, min_size=1, max_size=2))
def test_verdicts_equal_a_ledger_rebuilt_on_every_call(steps: list[tuple[str, int, list[Any]]],
                                                       probe: list[tuple[int, int | None, int]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        node = Node(directory)
        for kind, n, shares in steps:
            if kind == "prepare":
                obj = claim(f"c{n}", shares)
                expected = None if f"uid-c{n}" in node.state.claims else node.rebuilt_verdict(obj)
                assert node.prepare(obj) == expected
            elif kind == "unprepare":
                node.unprepare(f"c{n}")
            elif kind == "plugin+":
                index, memory, compute = shares[0]
                node.plugin = [p for p in node.plugin if p.name != f"p{n}"]
                node.plugin.append(plugin_pod(f"p{n}", index, memory or 2048, compute * 10))
            elif kind == "plugin-":
                node.plugin = [p for p in node.plugin if p.name != f"p{n}"]
            else:
                card = node.cards[n]
                node.cards = tuple(dataclasses.replace(c, healthy=not c.healthy) if c is card else c
                                   for c in node.cards)
            candidate = claim("probe", probe)
            assert node.verdict(candidate) == node.rebuilt_verdict(candidate)


def test_a_device_plugin_pod_that_appears_after_prepares_is_seen(tmp_path: Any) -> None:
    node = Node(str(tmp_path))
    assert node.prepare(claim("a", [(1, 8192, 0)])) is None  # the ledger is kept now
    node.plugin = [plugin_pod("er", 1, 6144, 0)]  # an extended-resource pod granted meanwhile
    assert node.prepare(claim("b", [(1, 4096, 0)])) == (
        "claim ns/b (uid-b): device gpu-1 (GPU-1) would be over-committed: 4096 MiB and 0% asked, "
        "14336 MiB and 0% of its 16384 MiB, 100% held by default/er, ns/claim a")
    node.plugin = []  # it ended: the space is free again
    assert node.prepare(claim("b", [(1, 4096, 0)])) is None


def test_an_unprepared_claim_frees_its_share_for_the_next_prepare(tmp_path: Any) -> None:
    node = Node(str(tmp_path))
    assert node.prepare(claim("a", [(4, 6144, 0)])) is None
    assert node.prepare(claim("b", [(4, 4096, 0)])) is not None
    node.unprepare("a")
    assert node.prepare(claim("b", [(4, 4096, 0)])) is None


def test_a_card_turned_unhealthy_is_seen_with_the_ledger_kept(tmp_path: Any) -> None:
    node = Node(str(tmp_path))
    assert node.prepare(claim("a", [(1, 1024, 0)])) is None
    node.cards = (dataclasses.replace(CARDS[0], healthy=False), CARDS[1])
    assert node.prepare(claim("b", [(1, 1024, 0)])) == "claim ns/b (uid-b): device gpu-1 is unhealthy"


def test_prepares_in_a_row_build_the_ledger_once(tmp_path: Any) -> None:
    node = Node(str(tmp_path))
    for i in range(10):
        assert node.prepare(claim(f"c{i}", [(1, 512, 1)])) is None
    assert node.state.held.rebuilds == 1
    node.unprepare("c0")
    assert node.prepare(claim("c10", [(4, 512, 1)])) is None
    assert node.state.held.rebuilds == 2


def test_device_plugin_pods_granted_before_any_claim_are_claimed_on_the_kept_ledger(tmp_path: Any) -> None:
    node = Node(str(tmp_path))
    for i in range(3):  # extended-resource pods admitted one after another, no claim prepared yet
        node.plugin = [*node.plugin, plugin_pod(f"p{i}", 1, 4096, 0)]
        assert node.verdict(claim("probe", [(1, 1024, 0)])) is None
    assert node.state.held.rebuilds == 1
    assert node.prepare(claim("a", [(1, 4096, 0)])) is None
    node.plugin = [*node.plugin, plugin_pod("p3", 4, 1024, 0)]  # after a claim: a rebuild orders them so
    assert node.prepare(claim("b", [(1, 1024, 0)])) == (
        "claim ns/b (uid-b): device gpu-1 (GPU-1) would be over-committed: 1024 MiB and 0% asked, "
        "16384 MiB and 0% of its 16384 MiB, 100% held by default/p0, default/p1, default/p2, ns/claim a")
    assert node.state.held.rebuilds == 2


def test_a_claim_the_kept_ledger_cannot_book_does_not_fail_its_prepare(tmp_path: Any) -> None:
    node = Node(str(tmp_path))
    assert node.prepare(claim("a", [(1, 1024, 0)])) is None

    def broken(_: GpuInventory) -> PodView:
        raise ValueError("no view")

    node.state.held.append(broken)  # as _book appends a claim just prepared
    assert node.prepare(claim("b", [(1, 1024, 0)])) is None
    assert node.state.held.rebuilds == 2
