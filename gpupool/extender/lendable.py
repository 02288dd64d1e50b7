"""What the extender reads of lending: a node's lent cards and a pod's borrower mark.

The annotations and their codec are the contract in :mod:`gpupool.api.lending` (the node agent
writes them); this module is the extender's view of them. A node whose annotation cannot be read
lends nothing: wrongly believing a card lent could place a borrower where an owner still works.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpupool.api.lending import (
    BORROWED_TRUE,
    Lendable,
    LendableCard,
    LendingFormatError,
    LendingNames,
    decode_lendable,
    is_borrowed,
)
from gpupool.core.lent import Loan
from gpupool.core.model import NodeSpec, Placement
from gpupool.core.state import ClusterState

log = logging.getLogger(__name__)

PER_MILLE_PER_PERCENT = 10
"""The annotation speaks percent of a card, the ledger per-mille."""

MAX_LENDABLE_TEXT = 64 * 1024
"""Longest annotation read; a node has at most a few hundred cards, far below this."""

__all__ = ["LendableCard", "LendingNames", "NodeLoans", "binding_marks", "borrower_annotations", "card_loans",
           "is_borrower", "node_lendable"]


def node_lendable(node: Mapping[str, Any], names: LendingNames) -> tuple[tuple[LendableCard, ...], str | None]:
    """The node's lent cards, and why none are read when the annotation is broken."""
    annotations = ((node.get("metadata") or {}).get("annotations")) or {}
    text = annotations.get(names.lendable)
    if text is None:
        return (), None
    if not isinstance(text, str) or len(text) > MAX_LENDABLE_TEXT:
        return (), f"annotation {names.lendable}: not a string of at most {MAX_LENDABLE_TEXT} bytes"
    try:
        lendable: Lendable = decode_lendable(text)
    except LendingFormatError as exc:
        return (), str(exc)
    return lendable.cards, None


def is_borrower(pod: Mapping[str, Any] | None, names: LendingNames) -> bool:
    """Whether a pod object carries the borrower mark (it was bound onto lent capacity)."""
    if pod is None:
        return False
    annotations = ((pod.get("metadata") or {}).get("annotations")) or {}
    return isinstance(annotations, Mapping) and is_borrowed(annotations, names)


def borrower_annotations(owner: str, names: LendingNames) -> dict[str, str]:
    """The marks the Binding of a borrower carries (``owner``: the lending pod, ``ns/name``)."""
    return {names.borrowed: BORROWED_TRUE, names.borrowed_from: owner}


def card_loans(cards: tuple[LendableCard, ...], spec: NodeSpec) -> tuple[tuple[Loan, ...], str | None]:
    """The ledger's loans of ``spec``'s cards (positions, per-mille), and why a listed card lends
    nothing: one the node's inventory does not have under that index and uuid (the annotation is
    older or newer than the inventory; lending it could place a borrower on another card)."""
    position = {card.index: pos for pos, card in enumerate(spec.cards)}
    loans: list[Loan] = []
    problems: list[str] = []
    for lent in cards:
        pos = position.get(lent.index)
        if pos is None or spec.cards[pos].uuid != lent.uuid:
            problems.append(f"card {lent.index} ({lent.uuid}) is not in the node's inventory")
            continue
        card = spec.cards[pos]
        loans.append(Loan(pos, lent.owner, min(lent.memory_mib, card.memory_mib),
                          min(lent.compute_percent * PER_MILLE_PER_PERCENT, card.compute)))
    return tuple(loans), ("; ".join(problems) or None)


class NodeLoans:
    """Every node's loans as the ledger books them, read from the node watch.

    The annotation is decoded again only when its text or the node's spec changed (heartbeats
    arrive every few seconds per node). A node whose annotation cannot be read lends nothing, and
    :attr:`problems` says why (a borrower's filter quotes it); its other GPU pods are not affected.
    """

    def __init__(self, names: LendingNames) -> None:
        self.names = names
        self.problems: dict[str, str] = {}
        self._seen: dict[str, tuple[object, NodeSpec]] = {}

    def apply(self, state: ClusterState, node: Mapping[str, Any], spec: NodeSpec) -> None:
        """Book the loans ``node`` publishes now in ``state`` (the node is present there)."""
        text = (((node.get("metadata") or {}).get("annotations")) or {}).get(self.names.lendable)
        seen = self._seen.get(spec.name)
        if seen is not None and seen[0] == text and seen[1] == spec:
            return
        self._seen[spec.name] = (text, spec)
        cards, problem = node_lendable(node, self.names)
        loans, unknown = card_loans(cards, spec)
        problem = problem or unknown
        if problem is None:
            self.problems.pop(spec.name, None)
        else:
            self.problems[spec.name] = problem
            log.warning("node %s: lends %d card(s): %s", spec.name, len(loans), problem)
        state.set_loans(spec.name, loans)

    def forget(self, name: str) -> None:
        """The node left (its loans went with it from the ledger)."""
        self._seen.pop(name, None)
        self.problems.pop(name, None)


def binding_marks(placement: Placement, annotations: Mapping[str, Any], names: LendingNames) -> dict[str, str]:
    """The lending annotations a Binding writes with ``placement``'s assignment: the borrower marks
    for a borrowed placement; for any other, ``borrowed: "false"`` over a mark the pod carries
    already (a stale or hand-written one), so the node agent never vouches for a pod on owned
    capacity as a borrower and the ledger books it where it was placed."""
    if placement.borrowed_from is not None:
        return borrower_annotations(placement.borrowed_from, names)
    return {names.borrowed: "false"} if is_borrowed(annotations, names) else {}
