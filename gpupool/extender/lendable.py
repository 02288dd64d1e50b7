"""What the extender reads of idle-GPU lending: a node's lendable cards and a pod's borrower mark.

The node agent publishes, per node, the capacity of the cards whose owner holds them idle
(annotation ``<domain>/lendable``, JSON ``{"v":1,"updated":..,"cards":[{"index","uuid","owner",
"ownerContainer","memoryMiB","computePercent","idleSince"}]}``, see docs/lending.md), and the
extender marks the pods it places on that capacity (``<domain>/borrowed: "true"`` and
``<domain>/borrowed-from: ns/pod``) in the Binding that carries their assignment.

Why a reader here: the codec of the contract lives with the node agent's side in the API package;
this module reads the same JSON strictly and fails closed (a broken or unknown-version annotation
lends nothing), so a bad annotation can never make the extender place a borrower on a card that is
not idle.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.core.units import COMPUTE_PER_CARD

LENDABLE_VERSION = 1
MAX_LENDABLE_TEXT = 64 * 1024
"""An annotation larger than this is refused unread (8 cards take well under 2 KiB)."""
PERCENT = 100


@dataclass(frozen=True)
class LendingNames:
    """The annotation keys of lending under one domain."""

    domain: str = "gpupool.io"

    @property
    def lendable(self) -> str:
        return f"{self.domain}/lendable"

    @property
    def borrowed(self) -> str:
        return f"{self.domain}/borrowed"

    @property
    def borrowed_from(self) -> str:
        return f"{self.domain}/borrowed-from"


class LendableError(ValueError):
    """A ``lendable`` annotation that cannot be read; the message says which field and why."""


@dataclass(frozen=True)
class LentCard:
    """One card's idle capacity lent by its owner, in the ledger's units."""

    index: int
    uuid: str
    owner: str
    memory_mib: int
    compute: int
    """Per-mille of the card (the contract's ``computePercent`` x 10)."""


def _int(entry: Mapping[str, Any], field: str, where: str, *, upper: int | None = None) -> int:
    value = entry.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (upper is not None and value > upper):
        bound = f"0..{upper}" if upper is not None else "a non-negative integer"
        raise LendableError(f"{where}.{field}: expected {bound}, got {value!r}")
    return value


def _str(entry: Mapping[str, Any], field: str, where: str) -> str:
    value = entry.get(field)
    if not isinstance(value, str):
        raise LendableError(f"{where}.{field}: expected a string, got {value!r}")
    return value


def decode_lendable(text: str) -> tuple[LentCard, ...]:
    """The lent cards of one node's annotation; raises :class:`LendableError` for anything else."""
    if len(text) > MAX_LENDABLE_TEXT:
        raise LendableError(f"lendable annotation is {len(text)} characters, at most {MAX_LENDABLE_TEXT}")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise LendableError(f"lendable annotation is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise LendableError("lendable annotation: expected a JSON object")
    if doc.get("v") != LENDABLE_VERSION:
        raise LendableError(f"lendable annotation: version {doc.get('v')!r}, this extender reads {LENDABLE_VERSION}")
    cards = doc.get("cards")
    if not isinstance(cards, list):
        raise LendableError("lendable annotation: cards must be a list")
    found: list[LentCard] = []
    for i, entry in enumerate(cards):
        where = f"lendable cards[{i}]"
        if not isinstance(entry, dict):
            raise LendableError(f"{where}: expected an object")
        card = LentCard(index=_int(entry, "index", where), uuid=_str(entry, "uuid", where),
                        owner=_str(entry, "owner", where), memory_mib=_int(entry, "memoryMiB", where),
                        compute=_int(entry, "computePercent", where, upper=PERCENT) * (COMPUTE_PER_CARD // PERCENT))
        found.append(card)
    if len({c.index for c in found}) != len(found):
        raise LendableError("lendable annotation: a card index is listed twice")
    return tuple(found)


def node_lendable(node: Mapping[str, Any], names: LendingNames) -> tuple[tuple[LentCard, ...], str | None]:
    """A node object's lent cards and why they could not be read (then nothing is lent)."""
    annotations = ((node.get("metadata") or {}).get("annotations")) or {}
    text = annotations.get(names.lendable)
    if text is None:
        return (), None
    if not isinstance(text, str):
        return (), "lendable annotation: expected a string"
    try:
        return decode_lendable(text), None
    except LendableError as exc:
        return (), str(exc)


def is_borrower(pod: Mapping[str, Any] | None, names: LendingNames) -> bool:
    """Whether a pod object carries the extender's borrower mark."""
    if pod is None:
        return False
    annotations = ((pod.get("metadata") or {}).get("annotations")) or {}
    return annotations.get(names.borrowed) == "true"


def borrower_annotations(owner: str, names: LendingNames) -> dict[str, str]:
    """The marks the Binding of a borrower carries (``owner``: the lending pod, ``ns/name``)."""
    return {names.borrowed: "true", names.borrowed_from: owner}
