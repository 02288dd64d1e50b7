"""The card rule: whether a card can take one slice of a request, why not, and what booking it does.

A whole card needs an idle card (fully free; it is then closed to sharing). A slice needs a card
that is not held whole and has both the memory and the compute free. Every caller asks this module:
the filter's masks over thousands of nodes, the explanation of a failing node, the card chooser's
scratch copy of one node and the ledger's check and booking of a placement, so they cannot disagree.

The checks are written once (:func:`checks`), as ``(verdict, passes)`` pairs in the order a failure
is reported. They use only comparisons, ``~`` and ``&``, so the same code answers for arrays of cards
(the vectorised paths) and for one card's numpy scalars (the ledger's check of a placement, where the
overhead of arrays of one element would dominate).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from gpupool.core.model import CardMode, GpuRequest
from gpupool.core.units import COMPUTE_PER_CARD

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Flags = BoolArray | np.bool_ | bool
"""Truth values for many cards (an array) or for one (a scalar)."""
Amounts = IntArray | np.integer[Any] | int
"""Quantities for many cards (an array) or for one (a scalar)."""

_IDLE = int(CardMode.IDLE)  # plain ints: enum member access is slow in the hot paths
_SHARED = int(CardMode.SHARED)
_EXCLUSIVE = int(CardMode.EXCLUSIVE)


class CardVerdict(IntEnum):
    """Why a card cannot take a slice (``FITS`` when it can), in the order the rule checks.

    Verdicts below :data:`FIRST_BOOKING_VERDICT` depend only on the card and the request; the others
    depend on what the card holds now, so a release can turn them into ``FITS``.
    """

    FITS = 0
    NO_CARD = 1
    UNHEALTHY = 2
    WRONG_MODEL = 3
    WRONG_KIND = 4
    OUT_OF_SCOPE = 5
    """The request's card scope (its group, pins, avoided cards or models) excludes the card."""
    NOT_IDLE = 6
    """A whole card was asked and the card holds something."""
    EXCLUSIVE_HELD = 7
    """A slice was asked and the card is held whole."""
    NO_MEMORY = 8
    NO_COMPUTE = 9


FIRST_BOOKING_VERDICT = CardVerdict.NOT_IDLE


class CardSlots(NamedTuple):
    """What the node side says about cards, and whether the request accepts them.

    ``model_ok`` / ``kind_ok`` / ``in_scope`` are None when the request accepts any model / kind /
    card (the check is then skipped, not evaluated as all-true; ``in_scope`` comes from the
    request's :class:`~gpupool.core.card_scope.CardScope`). A named tuple because the ledger builds
    one per card checked.
    """

    exists: Flags
    healthy: Flags
    model_ok: Flags | None = None
    kind_ok: Flags | None = None
    in_scope: Flags | None = None


class CardUse(NamedTuple):
    """What bookings changed on cards: their mode and free amounts."""

    mode: Amounts
    mem_free: Amounts
    compute_free: Amounts


class Demand(NamedTuple):
    """What one slice takes on a card; ``memory`` may vary per card (proportional requests)."""

    memory: Amounts
    compute: Amounts
    exclusive: bool


def memory_need(mem_total: IntArray, request: GpuRequest) -> IntArray:
    """Memory one slice of ``request`` takes on cards of the given total memory.

    A whole card takes all of it; a proportional slice (``memory_mib=None``) takes the floor of its
    compute share, so slices whose compute sums to a whole card never exceed the card's memory.
    """
    if request.exclusive:
        return mem_total
    if request.memory_share is not None:
        return mem_total * request.memory_share // COMPUTE_PER_CARD
    if request.memory_mib is None:
        return mem_total * request.compute // COMPUTE_PER_CARD
    return np.full_like(mem_total, request.memory_mib)


def demand_of(request: GpuRequest, mem_total: IntArray) -> Demand:
    """The demand of one slice of ``request`` on cards of the given total memory."""
    return Demand(memory_need(mem_total, request), request.compute, request.exclusive)


def slot_checks(slots: CardSlots) -> list[tuple[CardVerdict, Flags]]:
    """The checks no booking changes: the card exists, is healthy, has an accepted model and kind, and
    is within the request's scope."""
    found: list[tuple[CardVerdict, Flags]] = [
        (CardVerdict.NO_CARD, slots.exists), (CardVerdict.UNHEALTHY, slots.healthy)]
    if slots.model_ok is not None:
        found.append((CardVerdict.WRONG_MODEL, slots.model_ok))
    if slots.kind_ok is not None:
        found.append((CardVerdict.WRONG_KIND, slots.kind_ok))
    if slots.in_scope is not None:
        found.append((CardVerdict.OUT_OF_SCOPE, slots.in_scope))
    return found


def use_checks(use: CardUse, demand: Demand) -> list[tuple[CardVerdict, Flags]]:
    """The checks against bookings: idle for a whole card; not held whole, memory, compute for a slice."""
    if demand.exclusive:
        return [(CardVerdict.NOT_IDLE, use.mode == _IDLE)]
    return [
        (CardVerdict.EXCLUSIVE_HELD, use.mode != _EXCLUSIVE),
        (CardVerdict.NO_MEMORY, use.mem_free >= demand.memory),
        (CardVerdict.NO_COMPUTE, use.compute_free >= demand.compute),
    ]


def checks(slots: CardSlots, use: CardUse, demand: Demand) -> list[tuple[CardVerdict, Flags]]:
    """The whole rule, in the order failures are reported."""
    return slot_checks(slots) + use_checks(use, demand)


def _all(found: list[tuple[CardVerdict, Flags]]) -> Flags:
    result = found[0][1]
    for _, passes in found[1:]:
        result = result & passes
    return result


def fit_mask(slots: CardSlots, use: CardUse, demand: Demand) -> BoolArray:
    """Cards that can take one slice now (arrays in, array out; shapes broadcast)."""
    return np.asarray(_all(checks(slots, use, demand)), dtype=bool)


def verdicts(slots: CardSlots, use: CardUse, demand: Demand) -> IntArray:
    """The first failing check of every card (``FITS`` where none fails), as an array of codes."""
    found = checks(slots, use, demand)
    shape = np.broadcast_shapes(*(np.shape(passes) for _, passes in found))
    codes: IntArray = np.full(shape, int(CardVerdict.FITS), dtype=np.int64)
    for code, passes in reversed(found):  # earlier checks overwrite later ones
        codes = np.where(passes, codes, int(code))
    return codes


def verdict(slots: CardSlots, use: CardUse, demand: Demand) -> CardVerdict:
    """The first failing check of one card (scalars in), or ``FITS``."""
    for code, passes in checks(slots, use, demand):
        if not passes:
            return code
    return CardVerdict.FITS


class CardBook(NamedTuple):
    """The per-card arrays a booking changes: the ledger's, or a scratch copy of one node's."""

    mem_total: IntArray
    mem_free: IntArray
    compute_total: IntArray
    compute_free: IntArray
    mode: IntArray
    holders: IntArray

    def book(self, at: int | tuple[int, int], memory: int, compute: int, exclusive: bool,
             sign: int = 1) -> None:
        """Take (``sign`` 1) or give back (-1) one holder's share of card ``at``.

        A whole card is emptied and closed to sharing, and given back whole; a slice takes its memory
        and compute and leaves the card shared while any slice remains.
        """
        if exclusive:
            taking = sign > 0
            self.mem_free[at] = 0 if taking else self.mem_total[at]
            self.compute_free[at] = 0 if taking else self.compute_total[at]
            self.mode[at] = _EXCLUSIVE if taking else _IDLE
            self.holders[at] = 1 if taking else 0
            return
        self.mem_free[at] -= sign * memory
        self.compute_free[at] -= sign * compute
        self.holders[at] += sign
        self.mode[at] = _SHARED if self.holders[at] > 0 else _IDLE
