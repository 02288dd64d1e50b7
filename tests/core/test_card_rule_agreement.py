"""Every user of the card rule agrees, on random cluster states (hypothesis).

Random nodes (card sizes, models, kinds, health) receive random bookings through the ledger (pods
placed by the card chooser, raw slices and whole cards, health changes, releases). Then, for random
requests (whole cards, several cards, several cards allowed on one virtualised card, shared slices,
memory-only and compute-only slices, GPU models, card kinds, card scopes: group cards by node or
UUID, pinned and avoided UUIDs, avoided models) on every node:

* the node mask (:func:`node_fit_mask`) says the node fits,
* the explanation (:func:`explain_node`) says nothing,
* the card chooser (:func:`assign_on_node`) finds a placement, which the ledger's check accepts
  and which then applies,

all exactly together; and card by card, the vectorised verdicts, the card chooser's scratch copy,
the ledger's one-card verdict and a plain-Python statement of the rule agree.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core.card_rule import CardVerdict, Demand
from gpupool.core.card_scope import CardScope, CardSet
from gpupool.core.cards import NodeScratch, assign_on_node
from gpupool.core.feasibility import card_fit_mask, card_verdicts, explain_node, memory_need, node_fit_mask
from gpupool.core.model import (
    CardMode,
    CardSlice,
    ContainerRequest,
    GpuCard,
    GpuKind,
    GpuRequest,
    NodeSpec,
    Placement,
    PodRequest,
    VirtualCards,
)
from gpupool.core.state import ClusterState
from tests.core.builders import raw_placement

MODELS = ("A", "B", "C")
CARD_SIZES = (8_192, 16_276, 16_384, 40_960)
VIRTUAL_COMPUTE = 500
MAX_NODES = 4
COMPUTES = st.one_of(st.sampled_from([100, 250, 300, 500, 700]), st.integers(1, 999))
"""Round shares and card sizes are drawn often, so that free amounts often equal a request exactly
(the edge of every comparison of the rule)."""
MEMORIES = st.one_of(st.sampled_from([4_096, 8_138, 8_192, *CARD_SIZES]), st.integers(1, 20_000))


@st.composite
def node_specs(draw: st.DrawFn, name: str) -> NodeSpec:
    cards = []
    for i in range(draw(st.integers(0, 5))):
        virtual = draw(st.integers(0, 4)) == 0
        cards.append(GpuCard(index=i, uuid=f"{name}-{i}", model=draw(st.sampled_from(MODELS)),
                             memory_mib=draw(st.sampled_from(CARD_SIZES)),
                             compute=VIRTUAL_COMPUTE if virtual else 1000,
                             kind=GpuKind.VIRTUAL if virtual else GpuKind.PHYSICAL,
                             healthy=draw(st.integers(0, 7)) > 0))
    return NodeSpec(name=name, cpu_milli=draw(st.sampled_from([2_000, 16_000])),
                    memory_mib=draw(st.sampled_from([8_192, 65_536])), cards=tuple(cards))


NODE_NAMES = [f"n{i}" for i in range(MAX_NODES)]
UUIDS = [f"n{i}-{c}" for i in range(MAX_NODES) for c in range(5)]


@st.composite
def card_sets(draw: st.DrawFn) -> CardSet:
    return CardSet(frozenset(draw(st.lists(st.sampled_from(NODE_NAMES), max_size=2))),
                   frozenset(draw(st.lists(st.sampled_from(UUIDS), max_size=8))))


@st.composite
def card_scopes(draw: st.DrawFn) -> CardScope | None:
    """None half of the time; else a group's cards, pins, avoided cards and models, in any mix."""
    if draw(st.booleans()):
        return None
    within = tuple(draw(st.lists(card_sets(), max_size=2)))
    avoid = draw(card_sets()) if draw(st.booleans()) else CardSet()
    models = frozenset(draw(st.sampled_from([(), (), ("A",), ("B", "Z")])))
    return CardScope("scope", within, avoid, models)


@st.composite
def gpu_requests(draw: st.DrawFn) -> GpuRequest:
    models = frozenset(draw(st.sampled_from([(), (), ("A",), ("B", "C"), ("Z",)])))
    kind = draw(st.sampled_from([None, None, None, GpuKind.PHYSICAL, GpuKind.VIRTUAL]))
    scope = draw(card_scopes())
    form = draw(st.sampled_from(["fraction", "whole", "several", "memory", "compute", "both"]))
    if form == "whole":
        return dataclasses.replace(GpuRequest.whole(draw(st.integers(1, 3)), models), kind=kind, scope=scope)
    count = draw(st.integers(2, 3)) if form == "several" or (form == "both" and draw(st.booleans())) else 1
    compute = draw(COMPUTES) if form in ("fraction", "several", "compute", "both") else 0
    memory: int | None = None
    if form in ("memory", "both"):
        memory = draw(MEMORIES)
    elif form == "compute":
        memory = 0
    virtual = draw(st.sampled_from([None, VirtualCards.SHARED, VirtualCards.EXCLUSIVE])) if count > 1 else None
    return GpuRequest(count=count, compute=compute, memory_mib=memory, models=models, kind=kind, scope=scope,
                      virtual=virtual)


@st.composite
def pods(draw: st.DrawFn, key: str) -> PodRequest:
    main = ContainerRequest("main", cpu_milli=draw(st.sampled_from([0, 1_000, 4_000])),
                            memory_mib=draw(st.sampled_from([0, 1_024, 16_384])), gpu=draw(gpu_requests()))
    sidecar = ContainerRequest("sidecar", cpu_milli=500, memory_mib=256)
    return PodRequest(key=key, containers=(main, sidecar) if draw(st.booleans()) else (main,))


@st.composite
def clusters(draw: st.DrawFn) -> ClusterState:
    """A ledger after random bookings, all made through :meth:`ClusterState.apply`."""
    state = ClusterState([draw(node_specs(f"n{i}")) for i in range(draw(st.integers(1, MAX_NODES)))])
    for step in range(draw(st.integers(0, 14))):
        row = draw(st.integers(0, state.size - 1))
        node = state.specs[row].name
        card = draw(st.integers(0, 5))
        action = draw(st.sampled_from(["pod", "pod", "slice", "whole", "health", "release"]))
        placement: Placement | str | None = None
        if action == "pod":
            placement = assign_on_node(state, row, draw(pods(f"b{step}")))
        elif action == "slice":
            placement = raw_placement(f"b{step}", node, [CardSlice(card, draw(MEMORIES), draw(COMPUTES))])
        elif action == "whole" and card < len(state.specs[row].cards):
            total = state.specs[row].cards[card]
            placement = raw_placement(f"b{step}", node, [CardSlice(card, total.memory_mib, total.compute,
                                                                   exclusive=True)])
        elif action == "health" and card < len(state.specs[row].cards):
            state.set_card_health(node, card, draw(st.booleans()))
        elif action == "release" and state.placements:
            state.release(draw(st.sampled_from(sorted(state.placements))))
        if isinstance(placement, Placement) and state.check(placement) is None:
            state.apply(placement)
    return state


def plain_rule(state: ClusterState, row: int, card: int, request: GpuRequest) -> bool:
    """The rule in words, card by card, from the node's description and the ledger's usage view."""
    spec = state.specs[row]
    if card >= len(spec.cards):
        return False
    usage = state.card_usage(spec.name)[card]
    if not usage.healthy or not request.allows(spec.cards[card]):
        return False
    found = spec.cards[card]
    if request.scope is not None and not request.scope.admits(spec.name, found.uuid, found.model):
        return False
    if request.exclusive:
        return usage.mode == CardMode.IDLE
    return (usage.mode != CardMode.EXCLUSIVE and usage.memory_free >= request.memory_on(spec.cards[card])
            and usage.compute_free >= request.compute)


def check_cards_agree(state: ClusterState, row: int, request: GpuRequest) -> None:
    rows = np.array([row], dtype=np.int64)
    mask = card_fit_mask(state, request, rows)[0]
    codes = card_verdicts(state, request, rows)[0]
    np.testing.assert_array_equal(mask, codes == CardVerdict.FITS)
    np.testing.assert_array_equal(NodeScratch.of(state, row).fits(state, request), mask)
    assert mask.tolist() == [plain_rule(state, row, c, request) for c in range(state.max_cards)]
    need = memory_need(state, request, rows)[0]
    in_scope = state.scope_mask(request.scope)[row] if request.scope is not None else None
    for card in range(state.max_cards):
        if codes[card] in (CardVerdict.WRONG_MODEL, CardVerdict.WRONG_KIND):
            continue  # a placement names no model or kind: the ledger cannot check those
        demand = Demand(int(need[card]), request.compute, request.exclusive)
        assert state.card_verdict(row, card, demand, in_scope) == codes[card], (card, codes[card])


def check_ledger_agrees_card_by_card(state: ClusterState, row: int, pod: PodRequest) -> None:
    """A one-card placement of the pod is accepted by the ledger exactly where the mask says it fits."""
    request = pod.containers[0].gpu
    assert request is not None
    if request.count != 1:
        return
    rows = np.array([row], dtype=np.int64)
    anything = dataclasses.replace(request, models=frozenset(), kind=None)  # the ledger sees no model
    mask = card_fit_mask(state, anything, rows)[0]
    without_gpu = dataclasses.replace(pod, containers=(dataclasses.replace(pod.containers[0], gpu=None),
                                                       *pod.containers[1:]))
    room = bool(node_fit_mask(state, without_gpu, rows)[0])  # the node's CPU and memory
    need = memory_need(state, request, rows)[0]
    for card in range(len(state.specs[row].cards)):
        slc = CardSlice(card, int(need[card]), request.compute, exclusive=request.exclusive)
        placement = raw_placement(pod.key, state.specs[row].name, [slc], cpu=pod.cpu_milli,
                                  memory=pod.memory_mib)
        verdict = state.check(placement, request.scope)
        assert (verdict is None) == (room and bool(mask[card])), (card, verdict)


@pytest.mark.slow  # 200 random clusters through four implementations (scripts/test-all runs it)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.lists(pods("p"), min_size=1, max_size=4))
def test_mask_explanation_chooser_and_ledger_agree(state: ClusterState, requests: list[PodRequest]) -> None:
    for pod in requests:
        fits = node_fit_mask(state, pod)
        for row in range(state.size):
            request = pod.containers[0].gpu
            assert request is not None
            check_cards_agree(state, row, request)
            check_ledger_agrees_card_by_card(state, row, pod)
            reason = explain_node(state, row, pod)
            assert (reason is None) == bool(fits[row]), reason
            result = assign_on_node(state, row, pod)
            assert isinstance(result, Placement) == bool(fits[row]), result
            if isinstance(result, Placement):
                assert state.check(result, request.scope) is None
                state.apply(result, request.scope)
                state.release(pod.key)
