"""Which cards a request may use: one mechanism for every restriction on where a pod's slices go.

A pod's resource group binds it to some nodes and, on each, to some GPUs; an annotation can pin it
to GPUs by UUID, or make it avoid GPUs or GPU models; a quota with no room left on a model closes
that model to it; a quota's pools close the nodes outside them. All of these are the same question
asked of a card ("may this request use it?"), so they are one value, a :class:`CardScope`, that
rides on the :class:`~gpupool.core.model.GpuRequest`. The card rule (:mod:`gpupool.core.card_rule`)
turns it into one more check that no booking changes (``OUT_OF_SCOPE``), evaluated from one
per-scope mask of the ledger (:class:`ScopeMasks`), so the filter's masks, the explanation, the
card chooser and the ledger's check of a placement cannot disagree about it.

A scope is a frozen, hashable value: the scheduler's caches key on the request, so two pods of one
group share their cached masks and scores, and pods of two groups never do.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from gpupool.core.state import ClusterState

BoolArray = npt.NDArray[np.bool_]

MASKS_KEPT = 256
"""Scope masks remembered per ledger (least recently used first out): one per group, quota state
and pinning pod in use; 5,000 nodes x 8 cards is 40 KB a mask."""


@dataclass(frozen=True)
class CardSet:
    """Cards named by node (every card of the node) or by UUID (that card, wherever it is)."""

    nodes: frozenset[str] = frozenset()
    uuids: frozenset[str] = frozenset()

    def holds(self, node: str, uuid: str) -> bool:
        return node in self.nodes or uuid in self.uuids

    @property
    def empty(self) -> bool:
        return not self.nodes and not self.uuids


def names_any(model: str, words: frozenset[str]) -> bool:
    """Whether ``model`` contains one of ``words``, ignoring case (HAMi's ``use-gputype`` and
    ``nouse-gputype``: ``A100`` names ``NVIDIA-A100-SXM4-80GB``)."""
    upper = model.upper()
    return any(word.upper() in upper for word in words)


@dataclass(frozen=True)
class CardScope:
    """The cards a request may use: in every set of ``within``, in none of ``avoid``, of no model in
    ``avoid_models`` (exact names), of a model containing a word of every set of ``model_words``
    and none of ``avoid_model_words`` (substrings, any case: :func:`names_any`). ``label`` names the
    scope in reasons ("resource group team-a")."""

    label: str
    within: tuple[CardSet, ...] = ()
    avoid: CardSet = field(default_factory=CardSet)
    avoid_models: frozenset[str] = frozenset()
    model_words: tuple[frozenset[str], ...] = ()
    avoid_model_words: frozenset[str] = frozenset()

    def admits(self, node: str, uuid: str, model: str) -> bool:
        """The rule for one card, in plain Python (the masks compute the same for all cards)."""
        if any(not cards.holds(node, uuid) for cards in self.within):
            return False
        return not self.avoid.holds(node, uuid) and self.model_admitted(model)

    def model_admitted(self, model: str) -> bool:
        """Whether the scope's model rules (exact and by word) let a card of ``model`` in."""
        return model not in self.avoid_models and all(names_any(model, w) for w in self.model_words) and \
            not names_any(model, self.avoid_model_words)

    def narrowed(self, other: CardScope | None) -> CardScope:
        """Cards both scopes admit (labels joined with "and")."""
        if other is None:
            return self
        label = other.label if not self.label else (self.label if not other.label else
                                                     f"{self.label} and {other.label}")
        return CardScope(label, (*self.within, *other.within),
                         CardSet(self.avoid.nodes | other.avoid.nodes, self.avoid.uuids | other.avoid.uuids),
                         self.avoid_models | other.avoid_models, (*self.model_words, *other.model_words),
                         self.avoid_model_words | other.avoid_model_words)


def narrow(scope: CardScope | None, other: CardScope | None) -> CardScope | None:
    """Cards both admit, where None admits every card."""
    return other if scope is None else scope.narrowed(other)


class ScopeMasks:
    """Per scope, the ``[nodes, cards]`` mask of the ledger's cards it admits, kept until the ledger's
    layout changes (a node added, replaced or removed: the only changes that move a UUID, a model or
    a node name between columns; bookings and health do not).

    Building a mask walks only the scope's own names (a UUID index of the ledger is built once per
    layout), so a filter with a group's scope costs a dictionary lookup and a row gather.
    """

    def __init__(self) -> None:
        self._layout = -1
        self._positions: dict[str, tuple[int, int]] = {}
        self._masks: OrderedDict[CardScope, tuple[BoolArray, BoolArray]] = OrderedDict()

    def mask(self, state: ClusterState, scope: CardScope) -> BoolArray:
        """The read-only mask of the cards of ``state`` that ``scope`` admits."""
        return self._entry(state, scope)[0]

    def reach(self, state: ClusterState, scope: CardScope) -> BoolArray:
        """The read-only mask of the nodes (rows) holding at least one card ``scope`` admits."""
        return self._entry(state, scope)[1]

    def _entry(self, state: ClusterState, scope: CardScope) -> tuple[BoolArray, BoolArray]:
        if self._layout != state.layout_version:
            self._layout = state.layout_version
            self._positions = {}
            self._masks.clear()
        found = self._masks.get(scope)
        if found is not None:
            self._masks.move_to_end(scope)
            return found
        built = self._build(state, scope)
        reach: BoolArray = np.asarray(built.any(axis=1))
        reach.flags.writeable = False
        self._masks[scope] = (built, reach)
        if len(self._masks) > MASKS_KEPT:
            self._masks.popitem(last=False)
        return built, reach

    def _index(self, state: ClusterState) -> dict[str, tuple[int, int]]:
        if not self._positions and state.size:
            for row, spec in enumerate(state.specs):
                if state.present[row]:
                    for column, card in enumerate(spec.cards):
                        self._positions[card.uuid] = (row, column)
        return self._positions

    def _members(self, state: ClusterState, cards: CardSet) -> BoolArray:
        found: BoolArray = np.zeros((state.size, state.max_cards), dtype=bool)
        rows = [state.index[name] for name in cards.nodes if name in state.index]
        found[rows, :] = True
        positions = self._index(state)
        at = [positions[uuid] for uuid in cards.uuids if uuid in positions]
        if at:
            found[tuple(np.array(at, dtype=np.int64).T)] = True
        return found

    def _build(self, state: ClusterState, scope: CardScope) -> BoolArray:
        admitted: BoolArray = state.card_exists[:state.size].copy()
        for cards in scope.within:
            admitted &= self._members(state, cards)
        if not scope.avoid.empty:
            admitted &= ~self._members(state, scope.avoid)
        avoided = state.model_ids(scope.avoid_models)
        if scope.model_words or scope.avoid_model_words:
            avoided = [i for i, model in enumerate(state.models) if not scope.model_admitted(model)]
        if avoided:
            admitted &= ~np.isin(state.card_model[:state.size], avoided)
        admitted.flags.writeable = False
        return admitted
