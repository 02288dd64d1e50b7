"""What the extender reads of lending: a node's lent cards and a pod's borrower mark.

The annotations and their codec are the contract in :mod:`gpupool.api.lending` (the node agent
writes them); this module is the extender's view of them. A node whose annotation cannot be read
lends nothing: wrongly believing a card lent could place a borrower where an owner still works.
"""

from __future__ import annotations

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

MAX_LENDABLE_TEXT = 64 * 1024
"""Longest annotation read; a node has at most a few hundred cards, far below this."""

__all__ = ["LendableCard", "LendingNames", "borrower_annotations", "is_borrower", "node_lendable"]


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
