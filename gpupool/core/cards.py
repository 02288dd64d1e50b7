"""Choosing the exact cards of one node for every container of a pod.

The card rules follow Tencent GPUManager's three cases:

* more than one card: the set with the least communication cost (sum of link levels);
* exactly one whole card: the most isolated idle card, so that well-connected groups stay intact
  for later multi-card requests ("avoid orphan cards");
* less than one card: the slice goes where it leaves the least fragmentation; the default is best
  fit (the tightest card that holds it), and a placement policy can substitute its own chooser
  (FGD chooses the card that raises fragmentation least).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core import card_rule
from gpupool.core.card_rule import CardBook, CardUse
from gpupool.core.feasibility import card_slots, explain_cards, node_resources_problem
from gpupool.core.model import (
    CardSlice,
    ContainerAssignment,
    ContainerRequest,
    GpuRequest,
    NodeSpec,
    Placement,
    PodRequest,
)
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.core.virtual_cards import held_on_one_card, one_card_mask, wants_one_card

MAX_COMBINATIONS = 4096
"""Above this many candidate card sets the multi-card choice turns greedy (nodes of 16+ cards)."""


@dataclass(frozen=True)
class NodeScratch:
    """A private copy of one node's card bookings, consumed container by container.

    The copy is checked and booked by the ledger's own card rule (:mod:`gpupool.core.card_rule`), so a
    choice made on it is one the ledger accepts.
    """

    row: int
    spec: NodeSpec
    book: CardBook

    @staticmethod
    def of(state: ClusterState, row: int) -> NodeScratch:
        """A copy of what bookings change; the totals, which they only read, are the ledger's own."""
        return NodeScratch(row=row, spec=state.specs[row], book=CardBook(
            mem_total=state.card_mem_total[row],
            mem_free=state.card_mem_free[row].copy(),
            compute_total=state.card_compute_total[row],
            compute_free=state.card_compute_free[row].copy(),
            mode=state.card_mode[row].copy(),
            holders=state.card_holders[row].copy(),
        ))

    @property
    def mem_total(self) -> IntArray:
        """The arrays the card choosers of the policies read, by their short names."""
        return self.book.mem_total

    @property
    def mem_free(self) -> IntArray:
        return self.book.mem_free

    @property
    def compute_free(self) -> IntArray:
        return self.book.compute_free

    @property
    def mode(self) -> IntArray:
        return self.book.mode

    def fits(self, state: ClusterState, request: GpuRequest) -> BoolArray:
        """Cards of this copy that can take one slice of ``request`` (the ledger's rule)."""
        use = CardUse(self.book.mode, self.book.mem_free, self.book.compute_free)
        return card_rule.fit_mask(card_slots(state, request, self.row), use,
                                  card_rule.demand_of(request, self.book.mem_total))

    def take(self, card: int, request: GpuRequest) -> CardSlice:
        """Book one slice of ``request`` on ``card`` of this copy; the slice the ledger will hold."""
        if request.exclusive:
            memory, compute = int(self.book.mem_total[card]), int(self.book.compute_total[card])
        else:
            memory = int(card_rule.memory_need(self.book.mem_total[card:card + 1], request)[0])
            compute = request.compute
        self.book.book(card, memory, compute, request.exclusive)
        return CardSlice(card=card, memory_mib=memory, compute=compute, exclusive=request.exclusive)

    def one_card_fits(self, state: ClusterState, request: GpuRequest) -> BoolArray:
        """Cards of this copy that can hold every slice of a virtual-card request at once."""
        use = CardUse(self.book.mode, self.book.mem_free, self.book.compute_free)
        return one_card_mask(card_slots(state, request, self.row), use, request, self.book.mem_total)

    def take_virtual(self, card: int, request: GpuRequest) -> CardSlice:
        """Book all ``request.count`` slices on ``card`` as one holder: one slice of ``count`` devices."""
        memory, compute, exclusive = held_on_one_card(request, int(self.book.mem_total[card]),
                                                      int(self.book.compute_total[card]))
        self.book.book(card, memory, compute, exclusive)
        return CardSlice(card=card, memory_mib=memory, compute=compute, exclusive=exclusive,
                         devices=request.count)


SharedCardChooser = Callable[[ClusterState, NodeScratch, GpuRequest, BoolArray, int], int]
"""Picks one card for a sub-card slice among the ``True`` positions of the mask; the last argument
is the CPU the pod takes on the node (fragmentation-aware choosers need it)."""


def best_fit_card(state: ClusterState, scratch: NodeScratch, request: GpuRequest, mask: BoolArray,
                  cpu_milli: int = 0) -> int:
    """The tightest card that holds the slice (least free compute, then memory, then index).

    This is Alibaba gpushare's binpack rule generalised to two dimensions: filling the fullest
    card first keeps empty cards whole for whole-card requests.
    """
    candidates = np.flatnonzero(mask)
    keys = np.lexsort((candidates, scratch.mem_free[candidates], scratch.compute_free[candidates]))
    return int(candidates[keys[0]])


def most_isolated_card(spec: NodeSpec, candidates: list[int]) -> int:
    """Among idle cards, the one farthest from any other idle card (ties: lowest index)."""
    if len(candidates) == 1 or spec.topology is None:
        return candidates[0]

    def isolation(card: int) -> int:
        return min(int(spec.link(card, other)) for other in candidates if other != card)

    return max(candidates, key=lambda card: (isolation(card), -card))


def cheapest_card_set(spec: NodeSpec, candidates: list[int], count: int,
                      tiebreak: Callable[[int], int] | None = None) -> list[int]:
    """The ``count`` cards with the least total pairwise link cost.

    Ties go to the set whose ``tiebreak`` sum is smallest (best fit for slices), then the lowest
    indices. Large nodes fall back to a greedy build from every start card.
    """
    if count == len(candidates):
        return list(candidates)
    if spec.topology is None and tiebreak is None:
        return list(candidates[:count])

    def cost(cards: Sequence[int]) -> int:
        return sum(int(spec.link(a, b)) for a, b in itertools.combinations(cards, 2))

    def key(cards: Sequence[int]) -> tuple[int, int, tuple[int, ...]]:
        extra = sum(tiebreak(c) for c in cards) if tiebreak else 0
        return cost(cards), extra, tuple(sorted(cards))

    if math.comb(len(candidates), count) <= MAX_COMBINATIONS:
        best_combo: tuple[int, ...] | None = None
        for combo in itertools.combinations(candidates, count):
            if best_combo is None or key(combo) < key(best_combo):
                best_combo = combo
        assert best_combo is not None
        return list(best_combo)
    best: list[int] | None = None
    for start in candidates:
        chosen = [start]
        while len(chosen) < count:
            rest = [c for c in candidates if c not in chosen]
            chosen.append(min(rest, key=lambda c: (sum(int(spec.link(c, x)) for x in chosen), c)))
        if best is None or key(chosen) < key(best):
            best = chosen
    assert best is not None
    return sorted(best)


def choose_cards(state: ClusterState, scratch: NodeScratch, request: GpuRequest, mask: BoolArray,
                 shared_chooser: SharedCardChooser | None = None,
                 prefer: frozenset[int] = frozenset(), cpu_milli: int = 0) -> list[int]:
    """The cards for one container, following the three topology cases (see module doc)."""
    candidates = [int(c) for c in np.flatnonzero(mask)]
    preferred = [c for c in candidates if c in prefer]
    narrowed = len(preferred) >= request.count and not request.exclusive
    if narrowed:
        candidates = preferred
    if request.count == 1:
        if request.exclusive:
            return [most_isolated_card(scratch.spec, candidates)]
        sub_mask = mask
        if narrowed:
            sub_mask = np.zeros_like(mask)
            sub_mask[candidates] = True
        chooser = shared_chooser or best_fit_card
        return [chooser(state, scratch, request, sub_mask, cpu_milli)]
    return cheapest_card_set(scratch.spec, candidates, request.count,
                             tiebreak=lambda c: int(scratch.compute_free[c]))


def _size_key(container: ContainerRequest) -> tuple[int, int, int]:
    gpu = container.gpu
    assert gpu is not None
    return (1 if gpu.exclusive else 0, gpu.count, gpu.compute)


def assign_on_node(state: ClusterState, row: int, pod: PodRequest,
                   shared_chooser: SharedCardChooser | None = None) -> Placement | str:
    """Choose cards for every container of ``pod`` on node ``row``; a reason string if impossible.

    App containers are placed largest first (whole cards before slices) on a scratch copy of the
    node, so that one container never takes a card another needs. Init containers run before the
    app containers, so they are matched against the node as it was before the pod and preferably on
    the cards the app containers got (the ledger then holds the larger of the two, not the sum).
    """
    spec = state.specs[row]
    problem = node_resources_problem(state, row, pod)
    if problem is not None:
        return problem
    scratch = NodeScratch.of(state, row)
    chosen: dict[str, ContainerAssignment] = {}
    for container in sorted(pod.gpu_containers, key=_size_key, reverse=True):
        assert container.gpu is not None
        slices = _slices(state, scratch, container.gpu, shared_chooser, frozenset(), pod.cpu_milli)
        if slices is None:
            return _explain(state, row, container)
        chosen[container.name] = ContainerAssignment(container=container.name, slices=slices)
    app_cards = frozenset(s.card for a in chosen.values() for s in a.slices)
    assignments = [chosen[c.name] for c in pod.containers if c.name in chosen]
    for container in pod.init_containers:
        if container.gpu is None:
            continue
        before = NodeScratch.of(state, row)
        slices = _slices(state, before, container.gpu, shared_chooser, app_cards, pod.cpu_milli)
        if slices is None:
            return _explain(state, row, container)
        assignments.append(ContainerAssignment(container=container.name, slices=slices, init=True))
    placement = Placement(pod_key=pod.key, node=spec.name, cpu_milli=pod.cpu_milli,
                          memory_mib=pod.memory_mib, containers=tuple(assignments))
    problem = state.check(placement)
    return placement if problem is None else problem


def _slices(state: ClusterState, scratch: NodeScratch, request: GpuRequest,
            shared_chooser: SharedCardChooser | None, prefer: frozenset[int],
            cpu_milli: int) -> tuple[CardSlice, ...] | None:
    """Book one container's slices on ``scratch``; None when the node's cards cannot hold them.

    A virtual-card request goes on ONE card first when one can hold it all (seed 003: the smallest
    card that fits, as best fit picks it; a card the app containers hold is preferred for an init
    container), and on ``count`` physical cards otherwise (:mod:`gpupool.core.virtual_cards`).
    """
    # ``virtual`` first: a request that did not opt in (nearly all) costs one attribute test here
    if request.virtual is not None and wants_one_card(request):
        one = scratch.one_card_fits(state, request)
        if one.any():
            preferred = one.copy()
            preferred[[c for c in range(len(one)) if c not in prefer]] = False
            card = best_fit_card(state, scratch, request, preferred if preferred.any() else one, cpu_milli)
            return (scratch.take_virtual(card, request),)
    mask = scratch.fits(state, request)
    if int(mask.sum()) < request.count:
        return None
    cards = choose_cards(state, scratch, request, mask, shared_chooser, prefer=prefer, cpu_milli=cpu_milli)
    return tuple(scratch.take(card, request) for card in cards)


def _explain(state: ClusterState, row: int, container: ContainerRequest) -> str:
    """Why the container's cards are missing; the ledger's view may fit where the scratch copy did not
    (earlier containers of the pod took the cards), hence the fallback sentence."""
    assert container.gpu is not None
    reason = explain_cards(state, row, container.gpu)
    return reason or f"the cards left on node {state.specs[row].name} cannot hold container {container.name}"
