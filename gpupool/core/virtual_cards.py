"""Virtual cards: a slice of n cards served by one card presented as n devices (seed 003, rules 61-68).

The seed's rule for a multi-card request: when a single card has more free than the whole request,
that card is virtualised into n cards for the container, walking the cards from the smallest that
fits (rules 61 and 66); only when no single card can hold it do n physical cards serve it (rules 62
and 67). gpupool applies the rule to a pod that opts in (``GpuRequest.virtual``), in one of the
seed's two modes:

* ``shared``: the card holds n slices' memory and compute and stays open to other slices (the
  "remaining resources are allocated further" of rule 66);
* ``exclusive``: the card must be idle and is then held whole, as a whole-card request holds it
  (rule 61: "the remaining resources are not allocated"); the container's n devices split the card.

Either way the ledger books ONE card (one :class:`~gpupool.core.model.CardSlice` with ``devices`` =
n), so the card rule (:mod:`gpupool.core.card_rule`) judges the sum, and the simulator and the
extender, which share :func:`gpupool.core.cards.assign_on_node`, decide the same.
"""

from __future__ import annotations

import numpy as np

from gpupool.core import card_rule
from gpupool.core.card_rule import BoolArray, CardSlots, CardUse, Demand, IntArray
from gpupool.core.model import CardMode, GpuRequest, VirtualCards


def wants_one_card(request: GpuRequest) -> bool:
    """Whether ``request`` may be served by one card presented as ``count`` devices."""
    return request.virtual is not None and request.count > 1


def one_card_demand(request: GpuRequest, mem_total: IntArray) -> Demand:
    """What all ``count`` slices take together on cards of the given total memory (as one slice:
    the card rule then asks for a card that is not held whole and has the sum free)."""
    memory = card_rule.memory_need(mem_total, request) * request.count
    return Demand(memory, request.compute * request.count, False)


def one_card_mask(slots: CardSlots, use: CardUse, request: GpuRequest, mem_total: IntArray) -> BoolArray:
    """Cards (any shape of arrays) that can hold every slice of ``request`` at once; all False for a
    request that did not opt in. The exclusive mode needs an idle card besides."""
    if not wants_one_card(request):
        return np.zeros(np.shape(mem_total), dtype=bool)
    mask = card_rule.fit_mask(slots, use, one_card_demand(request, mem_total))
    if request.virtual == VirtualCards.EXCLUSIVE:
        mask &= np.asarray(use.mode) == int(CardMode.IDLE)
    return mask


def enough_cards(fits: BoolArray, one_card: BoolArray, request: GpuRequest) -> BoolArray:
    """Per row of ``[rows, cards]`` masks: ``count`` physical cards fit, or one card holds it all."""
    enough: BoolArray = fits.sum(axis=1) >= request.count
    if wants_one_card(request):
        enough |= one_card.any(axis=1)
    return enough


def held_on_one_card(request: GpuRequest, mem_total: int, compute_total: int) -> tuple[int, int, bool]:
    """Memory, compute and exclusivity the one card holds for the container: the sum of the slices
    (shared mode) or the whole card (exclusive mode, as a whole-card booking holds it)."""
    if request.virtual == VirtualCards.EXCLUSIVE:
        return mem_total, compute_total, True
    memory = int(card_rule.memory_need(np.array([mem_total], dtype=np.int64), request)[0])
    return memory * request.count, request.compute * request.count, False
