"""Which of the ledger's cards a claim request's selectors allow, as a card scope for its GPU
container (issue 24, docs/dra.md "Selectors the extender reads").

Why: the extender scores a claim pod's nodes by their best card for gpupool; kube-scheduler's DRA
filter kept the nodes where some card matches the selectors, not the nodes where a matching card
is the one with room. With the allowed cards as the request's
:class:`~gpupool.core.card_scope.CardScope`, the filter, the scores and the card choice consider
only them (the card rule's ``OUT_OF_SCOPE``), as for a pod pinned to cards by annotation.

The allowed cards are worked out once per selection and node layout (a node added, replaced or
removed changes the answer; bookings do not). A card's verdict depends on its attributes alone, so
cards that differ only in what the selectors do not read (their UUID, their index) are evaluated
once together, and verdicts are kept across layouts: a new layout evaluates only cards not seen
before, which matters for a selector reading UUIDs (every card its own evaluation: 250-400 ms on
5,000 nodes of 8 cards the first time, and before this at every node added or removed, inside a
filter call). A filter call of a pod whose claim was seen before costs a dictionary lookup.
"""

from __future__ import annotations

from collections import OrderedDict

from gpupool.api.dra import ATTR_INDEX, ATTR_UUID
from gpupool.core.card_scope import CardScope, CardSet
from gpupool.core.state import ClusterState
from gpupool.kube.card_device import card_device
from gpupool.kube.device_selector import EvalError, Selection

KEPT = 128
"""Selections remembered (least recently used first out), their scopes per layout and their verdicts."""

Alike = tuple[str, int, int, str, str, str, str, int]
"""What a selection can read of a card: its attributes and capacities (identity only if read)."""


class SelectedCards:
    """The allowed cards of each selection, for the ledger ``state`` of ``driver``'s devices.

    Called under the ledger's lock (the claim-pod reading holds it)."""

    def __init__(self, state: ClusterState, driver: str) -> None:
        self.state = state
        self.driver = driver
        self._layout = -1
        self._found: OrderedDict[Selection, CardScope | str] = OrderedDict()
        self._verdicts: OrderedDict[Selection, dict[Alike, bool | str]] = OrderedDict()
        """Each selection's verdict on each kind of card (a failure's reason as str), kept across layouts."""

    def scope(self, selection: Selection) -> CardScope | str:
        """The scope admitting exactly the cards ``selection`` allows; a reason (str) when it cannot
        be told: a selector fails on some card (CEL aborts the allocation there, which the extender
        does not model) or it allows none of the ledger's cards (the DRA filter saw otherwise)."""
        if self._layout != self.state.layout_version:
            self._found.clear()
            self._layout = self.state.layout_version
        found = self._found.get(selection)
        if found is None:
            found = self._evaluate(selection)
            self._found[selection] = found
            while len(self._found) > KEPT:
                self._found.popitem(last=False)
        else:
            self._found.move_to_end(selection)
        return found

    def _evaluate(self, selection: Selection) -> CardScope | str:
        allowed: set[str] = set()
        names = selection.attribute_names()
        by_uuid, by_index = ATTR_UUID in names, ATTR_INDEX in names
        seen = self._verdicts_of(selection)
        for row, spec in enumerate(self.state.specs):
            if not self.state.present[row]:
                continue
            for card in spec.cards:
                # cards alike but for their identity answer alike: evaluated once (a few models
                # and sizes in a cluster of thousands of cards)
                alike = (card.model, card.memory_mib, card.compute, card.kind, card.profile, card.parent,
                         card.uuid if by_uuid else "", card.index if by_index else -1)
                found = seen.get(alike)
                if found is None:
                    try:
                        found = seen[alike] = selection.matches(card_device(card, self.driver))
                    except EvalError as exc:
                        found = seen[alike] = str(exc)
                if isinstance(found, str):
                    return f"selector {selection} fails on card {card.uuid[:64]} of node {spec.name[:64]}: {found}"
                if found:
                    allowed.add(card.uuid)
        if not allowed:
            return f"selector {selection} allows none of the cards the extender knows"
        return CardScope("the claim's selectors", within=(CardSet(uuids=frozenset(allowed)),))

    def _verdicts_of(self, selection: Selection) -> dict[Alike, bool | str]:
        """The selection's kept verdicts; emptied once they outgrow twice the cards there are (cards of
        nodes long gone would otherwise stay for a selector reading UUIDs)."""
        seen = self._verdicts.get(selection)
        cards = sum(len(spec.cards) for spec in self.state.specs)
        if seen is None or len(seen) > 2 * cards + 64:
            seen = self._verdicts[selection] = {}
            while len(self._verdicts) > KEPT:
                self._verdicts.popitem(last=False)
        else:
            self._verdicts.move_to_end(selection)
        return seen
