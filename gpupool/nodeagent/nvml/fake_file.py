"""The fake-GPU file (YAML) read strictly: every field typed, bounded and named in the error.

Why strict: the node agent publishes what this file says as the node's ``inventory-v1``. A file the
extender's reader refuses (a 31-digit memory, two cards with one uuid, a links matrix of the wrong
size, ``memoryMiB: 1.5`` read as 1, ``healthy: "false"`` read as true) would load without a word
and leave the node silently unusable, or advertise billions of kubelet devices. Here the file's own
shape is checked field by field, and the cards and links then pass
:func:`gpupool.api.annotations.check_inventory`, the extender's rule, so a file the agent accepts
is an inventory the extender accepts. Errors read ``<file>: <field>: <problem>``.

The format is described in :mod:`gpupool.nodeagent.nvml.fake` and docs/node-agent.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.annotations import AnnotationError, Inventory, check_inventory
from gpupool.api.fields import check_bounded, shown
from gpupool.api.limits import (
    MAX_CARD_INDEX,
    MAX_CARD_MEMORY_MIB,
    MAX_CARDS_PER_NODE,
    MAX_COMPUTE_PER_CARD,
    text_problem,
)
from gpupool.core.model import GpuCard, GpuKind, LinkLevel, Topology

TOP_KEYS = frozenset({"model", "cards", "topology", "links", "devicePathPrefix", "events", "usage"})
CARD_KEYS = frozenset({"index", "uuid", "model", "memoryMiB", "healthy", "pciBusId", "kind", "computeMilli",
                       "profile", "parent"})
PCI_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
"""NVML's form (``00000000:3B:00.0``) or the kernel's (``0000:3b:00.0``)."""
EVENT_KEYS = frozenset({"at", "card", "xid", "recover", "lost"})
DEFAULT_MODEL = "FAKE-GPU"
DEFAULT_DEVICE_PREFIX = "/dev/nvidia"
MAX_TOPOLOGY_DEPTH = 3
"""Sockets, switches, cards: the deepest tree :meth:`Topology.from_tree` reads."""


class FakeGpuFileError(ValueError):
    """The fake-GPU YAML file is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class ScriptedEvent:
    """One line of the ``events`` list."""

    at: float
    card: int
    kind: str  # "xid", "recover", "lost"
    xid: int = 0


@dataclass(frozen=True)
class FakeGpuFile:
    """The validated content of a fake-GPU file."""

    cards: tuple[GpuCard, ...]
    topology: Topology
    device_paths: tuple[str, ...]
    events: tuple[ScriptedEvent, ...]
    pci_bus_ids: tuple[str, ...] = ()


def read_fake_gpu_file(data: Any, source: str) -> FakeGpuFile:
    """Validate the parsed YAML of ``source``; raises :class:`FakeGpuFileError` naming the field."""
    try:
        return _read(data)
    except (_FieldError, AnnotationError) as exc:
        raise FakeGpuFileError(f"{source}: {exc}") from None


class _FieldError(ValueError):
    """A problem in one field, before the file name is put in front."""


def _read(data: Any) -> FakeGpuFile:
    top = _mapping(data, "", TOP_KEYS)
    if not isinstance(top.get("cards"), list):
        raise _FieldError("cards: expected a list of cards")
    model = _text(top, "model", "", DEFAULT_MODEL)
    raw_cards: list[Any] = top["cards"]
    if len(raw_cards) > MAX_CARDS_PER_NODE:
        raise _FieldError(f"cards: at most {MAX_CARDS_PER_NODE} cards, got {len(raw_cards)}")
    cards = tuple(_card(raw, pos, model) for pos, raw in enumerate(raw_cards))
    if "links" in top and "topology" in top:
        raise _FieldError("links and topology: give one of them, not both")
    if "links" in top:
        topology = _links(top["links"])
    elif "topology" in top:
        topology = Topology.from_tree(_groups(top["topology"], len(cards), "topology", 1), len(cards))
    else:
        topology = Topology.flat(len(cards))
    check_inventory(Inventory(cards, topology), what="")  # the extender's rule for what we publish
    prefix = _text(top, "devicePathPrefix", "", DEFAULT_DEVICE_PREFIX)
    events = _list(top.get("events"), "events")
    indices = {c.index for c in cards}
    return FakeGpuFile(cards=cards, topology=topology, device_paths=tuple(f"{prefix}{c.index}" for c in cards),
                       events=tuple(_event(raw, i, indices) for i, raw in enumerate(events)),
                       pci_bus_ids=tuple(_pci_bus_id(raw, pos) for pos, raw in enumerate(raw_cards)))


def _card(raw: Any, pos: int, model: str) -> GpuCard:
    where = f"cards[{pos}]"
    entry = _mapping(raw, where, CARD_KEYS)
    if "memoryMiB" not in entry:
        raise _FieldError(f"{where}: missing field memoryMiB")
    index, memory = _integer(entry, "index", where, pos), _integer(entry, "memoryMiB", where, 0)
    # The contract's bounds first: past them the core model would refuse the card without the
    # file's field in its message.
    check_bounded(index, f"{where}.index", MAX_CARD_INDEX)
    check_bounded(memory, f"{where}.memoryMiB", MAX_CARD_MEMORY_MIB, "MiB")
    kind = _text(entry, "kind", where, GpuKind.PHYSICAL.value)
    if kind not in {k.value for k in GpuKind}:
        raise _FieldError(f"{where}.kind: expected physical or virtual, got {shown(kind)}")
    compute = _integer(entry, "computeMilli", where, MAX_COMPUTE_PER_CARD)
    check_bounded(compute, f"{where}.computeMilli", MAX_COMPUTE_PER_CARD)
    return GpuCard(index=index, uuid=_text(entry, "uuid", where, f"GPU-fake-{pos:04d}"),
                   model=_text(entry, "model", where, model), memory_mib=memory, compute=compute,
                   kind=GpuKind(kind), healthy=_flag(entry, "healthy", where, True),
                   profile=_optional_text(entry, "profile", where), parent=_optional_text(entry, "parent", where))


def _optional_text(entry: Mapping[str, Any], key: str, where: str) -> str:
    """A name that may be left out (``""`` then); present, it must be a usable name."""
    return _text(entry, key, where, "") if key in entry else ""


def _pci_bus_id(raw: Any, pos: int) -> str:
    """The card's ``pciBusId`` (``""`` when absent): what names its region of the dmem controller."""
    where = f"cards[{pos}]"
    entry = _mapping(raw, where, CARD_KEYS)
    if "pciBusId" not in entry:
        return ""
    value = _text(entry, "pciBusId", where, "")
    if not PCI_BUS_ID.match(value):
        raise _FieldError(f"{where}.pciBusId: {shown(value)} is not a PCI address like 00000000:3B:00.0")
    return value


def _links(raw: Any) -> Topology:
    rows = _list(raw, "links")
    levels: list[tuple[LinkLevel, ...]] = []
    for i, row in enumerate(rows):
        values = _list(row, f"links[{i}]")
        levels.append(tuple(_level(value, f"links[{i}][{j}]") for j, value in enumerate(values)))
    return Topology(tuple(levels))  # its size and symmetry are the inventory check's


def _level(value: Any, where: str) -> LinkLevel:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= max(LinkLevel):
        raise _FieldError(f"{where}: expected a link level 0..{int(max(LinkLevel))}, got {shown(value)}")
    return LinkLevel(value)


def _groups(raw: Any, count: int, where: str, depth: int) -> list[Any]:
    """Nested groups of card positions (``[[0, 1], [2, 3]]``), each within ``0..count-1``."""
    if depth > MAX_TOPOLOGY_DEPTH:
        raise _FieldError(f"{where}: nested deeper than {MAX_TOPOLOGY_DEPTH} levels")
    items = _list(raw, where)
    for i, item in enumerate(items):
        if isinstance(item, list):
            _groups(item, count, f"{where}[{i}]", depth + 1)
        elif isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < count:
            raise _FieldError(f"{where}[{i}]: expected a card position 0..{count - 1} or a group, "
                              f"got {shown(item)}")
    return items


def _event(raw: Any, pos: int, indices: set[int]) -> ScriptedEvent:
    where = f"events[{pos}]"
    entry = _mapping(raw, where, EVENT_KEYS)
    at = entry.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) or at < 0:
        raise _FieldError(f"{where}.at: expected seconds after start (a finite number >= 0), got {shown(at)}")
    card = _integer(entry, "card", where, None)
    if card not in indices:
        raise _FieldError(f"{where}.card: no card has index {card}")
    kind = "recover" if _flag(entry, "recover", where, False) else "lost" if _flag(entry, "lost", where, False) \
        else "xid"
    return ScriptedEvent(at=float(at), card=card, kind=kind, xid=_integer(entry, "xid", where, 0))


# --------------------------------------------------------------------------------- field readers
def _mapping(raw: Any, where: str, keys: frozenset[str]) -> Mapping[str, Any]:
    """A mapping with no key outside ``keys`` (a typo such as ``memoryMib`` is an error, not a default)."""
    if not isinstance(raw, dict):
        raise _FieldError(f"{where or 'the file'}: expected a mapping, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in keys)
    if unknown:
        raise _FieldError(f"{where or 'the file'}: unknown field {shown(unknown[0])} "
                          f"(known: {', '.join(sorted(keys))})")
    return raw


def _name(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _list(raw: Any, where: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _FieldError(f"{where}: expected a list, got {type(raw).__name__}")
    return raw


def _integer(entry: Mapping[str, Any], key: str, where: str, default: int | None) -> int:
    """A whole number >= 0 (YAML ``1.5``, ``"16"`` and ``true`` are not); bounds are the inventory's."""
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _FieldError(f"{_name(where, key)}: expected a whole number, got {shown(value)}")
    if value < 0:
        raise _FieldError(f"{_name(where, key)}: must be non-negative, got {shown(value)}")
    return value


def _text(entry: Mapping[str, Any], key: str, where: str, default: str) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise _FieldError(f"{_name(where, key)}: expected a string, got {type(value).__name__} {shown(value)}")
    problem = text_problem(value)
    if problem is not None:
        raise _FieldError(f"{_name(where, key)}: {problem}")
    return value


def _flag(entry: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = entry.get(key, default)
    if not isinstance(value, bool):
        raise _FieldError(f"{_name(where, key)}: expected true or false, got {shown(value)}")
    return value
