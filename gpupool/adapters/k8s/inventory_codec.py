"""The node annotation ``gpupool.io/inventory-v1``: the node's cards as the extender reads them.

Schema (compact JSON, validated on read)::

    {"version": 1,
     "cards": [{"index": 0, "uuid": "GPU-..", "model": "NVIDIA-H200", "memoryMiB": 143771,
                "healthy": true, "kind": "physical"}, ...],
     "links": [[0, 1, ...], ...]}      # LinkLevel numbers, cards in list order

Per-card truth (not a node average) so that nodes mixing card sizes or models are scheduled right.
"""

from __future__ import annotations

import json
from typing import Any

from gpupool.core.model import GpuCard, GpuKind, LinkLevel, Topology

VERSION = 1


class InventoryFormatError(ValueError):
    """The annotation is not a valid inventory-v1 document; the message says what is wrong."""


def encode_inventory(cards: tuple[GpuCard, ...] | list[GpuCard], topology: Topology) -> str:
    """Serialise cards and their link matrix."""
    doc = {
        "version": VERSION,
        "cards": [{"index": c.index, "uuid": c.uuid, "model": c.model, "memoryMiB": c.memory_mib,
                   "healthy": c.healthy, "kind": c.kind.value} for c in cards],
        "links": [[int(topology.link(a.index, b.index)) for b in cards] for a in cards],
    }
    return json.dumps(doc, separators=(",", ":"))


def decode_inventory(text: str) -> tuple[tuple[GpuCard, ...], Topology]:
    """Parse and validate; returns the cards and a topology indexed by position in ``cards``."""
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InventoryFormatError(f"inventory-v1 is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise InventoryFormatError("inventory-v1 needs an object with version 1")
    raw_cards = doc.get("cards")
    if not isinstance(raw_cards, list):
        raise InventoryFormatError("inventory-v1: 'cards' must be a list")
    cards = []
    for i, raw in enumerate(raw_cards):
        try:
            cards.append(GpuCard(index=int(raw["index"]), uuid=str(raw["uuid"]), model=str(raw["model"]),
                                 memory_mib=int(raw["memoryMiB"]), healthy=bool(raw.get("healthy", True)),
                                 kind=GpuKind(raw.get("kind", "physical"))))
        except (KeyError, TypeError, ValueError) as exc:
            raise InventoryFormatError(f"inventory-v1: cards[{i}]: {exc}") from exc
    links = doc.get("links") or []
    if links and (len(links) != len(cards) or any(len(row) != len(cards) for row in links)):
        raise InventoryFormatError("inventory-v1: 'links' must be a square matrix over the cards")
    try:
        topology = (Topology(tuple(tuple(LinkLevel(int(v)) for v in row) for row in links)) if links
                    else Topology.flat(len(cards)))
    except ValueError as exc:
        raise InventoryFormatError(f"inventory-v1: bad link level: {exc}") from exc
    return tuple(cards), topology
