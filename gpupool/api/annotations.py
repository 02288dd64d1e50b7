"""Versioned JSON codecs for the annotations gpupool keeps its state in.

Why annotations and why strict: the cluster's GPU state lives in the API (architecture.md), so every
process can be killed and rebuild its view from these values. A value that is silently misread
would double-book a card after a restart, so every decoder validates the whole document and raises
:class:`AnnotationError` naming the field; callers report it instead of guessing.

Three documents:

``<domain>/inventory-v1`` (node, written by the node side)::

    {"v": 1,
     "cards": [{"index": 0, "uuid": "GPU-...", "model": "Tesla-V100", "memoryMiB": 16276,
                "healthy": true}, ...],
     "links": [[0, 2], [2, 0]]}

  ``cards[].kind`` ("physical" | "virtual") is optional. A virtual card (a MIG instance) may add
  ``computeMilli`` (its compute in per-mille of a whole card, 1000 when absent), ``profile``
  (``"3g.40gb"``) and ``parent`` (its physical card's UUID); a physical card carries neither of the
  last two. ``links`` is optional: a square, symmetric
  matrix of link levels in card order (0 self, 1 NVLink, 2 one PCIe switch, 3 several switches,
  4 host bridge, 5 NUMA node, 6 across sockets; :class:`gpupool.core.model.LinkLevel`).

``<domain>/assignment-v1`` (pod, written by the extender at bind)::

    {"v": 1, "node": "n3", "time": "2024-05-01T10:00:00Z", "podUID": "6f1c...",
     "containers": [{"name": "main", "init": false,
                     "cards": [{"index": 0, "uuid": "GPU-...", "memoryMiB": 8138,
                                "computeMilli": 0, "exclusive": false}]}]}

  Compute is per-mille of one card (the core's unit, exact for trace requests). A card entry may add
  ``"devices": n`` (2..16; v1.2, written only above 1): the container sees that card as n devices
  (a virtual card, :mod:`gpupool.core.virtual_cards`), ``memoryMiB`` and ``computeMilli`` being the
  total the n devices split evenly. ``podUID``
  (optional; v1.1, older writers omit it, older readers ignore it) is the uid of the pod the cards
  were decided for: a Binding is addressed by name only, so a pod replaced under that name may
  receive it, and the readers then refuse the assignment (:func:`foreign_assignment`).

``<domain>/allocated-v1`` (pod, written by the node side after Allocate)::

    {"v": 1, "node": "n3", "time": "2024-05-01T10:00:03Z",
     "containers": [{"name": "main", "init": false,
                     "cards": [{"index": 0, "uuid": "GPU-...", "memoryMiB": 8138,
                                "computeMilli": 0}],
                     "resources": {"gpupool.io/gpu-mem": 31}}]}

  ``containers`` (optional: the extender needs only ``node``) records what each container really
  received and how many kubelet devices of each resource it holds; the node agent reads it back
  after a restart to know which containers were already served.

Bounds: every number is an integer from 0 to its maximum in :mod:`gpupool.api.limits` (card
memory 1 TiB, index 255, compute 1000, 64 cards per node), and uuids, models and names are
non-empty printable text of at most 512 characters. The node side and the extender read and write
these documents with this one module (:func:`check_inventory` is the node side's check before it
publishes), so a field renamed or a value refused on one side cannot silently break the other.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpupool.api.fields import SCHEMA_VERSION as SCHEMA_VERSION  # re-exported: the codecs' public names
from gpupool.api.fields import AnnotationError as AnnotationError
from gpupool.api.fields import (
    bounded,
    check_text,
    load_document,
    text,
)
from gpupool.api.fields import field as read_field
from gpupool.api.fields import format_time as format_time  # re-exported: the codecs' public names
from gpupool.api.fields import parse_time as parse_time
from gpupool.api.limits import (
    MAX_CARD_INDEX,
    MAX_CARD_MEMORY_MIB,
    MAX_CARDS_PER_NODE,
    MAX_COMPUTE_PER_CARD,
    MAX_DEVICES_PER_RESOURCE,
)
from gpupool.core.model import (
    MAX_VIRTUAL_DEVICES,
    CardSlice,
    ContainerAssignment,
    GpuCard,
    GpuKind,
    LinkLevel,
    NodeSpec,
    Placement,
    Topology,
)


# --------------------------------------------------------------------------------- card entries
def _card_doc(ref: CardRef) -> dict[str, Any]:
    """A card entry as both documents write it (``assignment-v1`` adds ``exclusive``)."""
    return {"index": ref.index, "uuid": ref.uuid, "memoryMiB": ref.memory_mib, "computeMilli": ref.compute}


def _card_ref(card: Any, where: str) -> CardRef:
    """Read a card entry's index, uuid, memoryMiB and computeMilli (``exclusive`` left False)."""
    if not isinstance(card, dict):
        raise AnnotationError(f"{where}: expected an object")
    compute = bounded(card, "computeMilli", where, MAX_COMPUTE_PER_CARD)
    return CardRef(index=bounded(card, "index", where, MAX_CARD_INDEX), uuid=text(card, "uuid", where),
                   memory_mib=bounded(card, "memoryMiB", where, MAX_CARD_MEMORY_MIB, "MiB"), compute=compute)


def _card_list(doc: Mapping[str, Any], where: str) -> list[Any]:
    """A ``cards`` list of at most one node's worth of cards."""
    raw: list[Any] = read_field(doc, "cards", list, where)
    if len(raw) > MAX_CARDS_PER_NODE:
        raise AnnotationError(f"{_path(where, 'cards')}: at most {MAX_CARDS_PER_NODE} cards, got {len(raw)}")
    return raw


def _path(what: str, rest: str) -> str:
    """``what.rest``, or ``rest`` alone when the document has no name of its own (``what`` empty)."""
    return f"{what}.{rest}" if what else rest


# ------------------------------------------------------------------------------------ inventory
@dataclass(frozen=True)
class Inventory:
    """A node's cards in index order and their link matrix (None when the node did not publish it)."""

    cards: tuple[GpuCard, ...]
    topology: Topology | None = None


def decode_inventory(value: str) -> Inventory:
    """Validate and decode an ``inventory-v1`` value."""
    what = "inventory-v1"
    return _read_inventory(load_document(value, what), what)


def encode_inventory(inventory: Inventory) -> str:
    """The compact JSON of an ``inventory-v1`` value (what the node side publishes).

    The value is checked with the reader's own rules first (:func:`check_inventory`), so the node
    side can never publish an inventory that the extender would refuse.
    """
    doc = _inventory_doc(inventory)
    _read_inventory(doc, "inventory-v1")
    return json.dumps(doc, separators=(",", ":"))


def check_inventory(inventory: Inventory, what: str = "inventory-v1") -> None:
    """Raise :class:`AnnotationError` if ``inventory`` breaks a rule of ``inventory-v1``.

    The one rule for both sides: the node agent checks its cards with it before serving or
    publishing them (a fake-GPU file at load), the extender applies it when it reads the annotation.
    Messages name the field as ``<what>.cards[<position>].<field>`` (``cards[<position>].<field>``
    when ``what`` is empty), positions in the given order.
    """
    _read_inventory(_inventory_doc(inventory), what)


def _inventory_doc(inventory: Inventory) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "cards": [
            {"index": c.index, "uuid": c.uuid, "model": c.model, "memoryMiB": c.memory_mib,
             "healthy": c.healthy, **_virtual_fields(c)}
            for c in inventory.cards
        ],
    }
    if inventory.topology is not None:
        doc["links"] = [[int(level) for level in row] for row in inventory.topology.levels]
    return doc


def _virtual_fields(card: GpuCard) -> dict[str, Any]:
    """The optional fields of a card entry, written only when they differ from a physical card's."""
    found: dict[str, Any] = {}
    if card.kind != GpuKind.PHYSICAL:
        found["kind"] = card.kind.value
    if card.compute != MAX_COMPUTE_PER_CARD:
        found["computeMilli"] = card.compute
    if card.profile:
        found["profile"] = card.profile
    if card.parent:
        found["parent"] = card.parent
    return found


def _optional_text(raw: Mapping[str, Any], key: str, where: str) -> str:
    """An optional name field: absent is ``""``, present must be a usable name."""
    return text(raw, key, where) if key in raw else ""


def _read_inventory(doc: Mapping[str, Any], what: str) -> Inventory:
    cards: list[GpuCard] = []
    seen_index: set[int] = set()
    seen_uuid: set[str] = set()
    for pos, raw in enumerate(_card_list(doc, what)):
        where = _path(what, f"cards[{pos}]")
        if not isinstance(raw, dict):
            raise AnnotationError(f"{where}: expected an object")
        index = bounded(raw, "index", where, MAX_CARD_INDEX)
        uuid = text(raw, "uuid", where)
        model = text(raw, "model", where)
        memory = bounded(raw, "memoryMiB", where, MAX_CARD_MEMORY_MIB, "MiB")
        healthy = read_field(raw, "healthy", bool, where)
        kind_text = raw.get("kind", GpuKind.PHYSICAL.value)
        if kind_text not in {k.value for k in GpuKind}:
            raise AnnotationError(f"{where}.kind: expected physical or virtual, got {str(kind_text)[:64]!r}")
        compute = bounded(raw, "computeMilli", where, MAX_COMPUTE_PER_CARD) if "computeMilli" in raw \
            else MAX_COMPUTE_PER_CARD
        profile, parent = _optional_text(raw, "profile", where), _optional_text(raw, "parent", where)
        if (profile or parent) and kind_text != GpuKind.VIRTUAL:
            raise AnnotationError(f"{where}: profile and parent belong to a virtual card only")
        if index in seen_index:
            raise AnnotationError(f"{where}.index: card index {index} appears twice")
        if uuid in seen_uuid:
            raise AnnotationError(f"{where}.uuid: {uuid} appears twice")
        seen_index.add(index)
        seen_uuid.add(uuid)
        cards.append(GpuCard(index=index, uuid=uuid, model=model, memory_mib=memory, compute=compute,
                             kind=GpuKind(kind_text), healthy=healthy, profile=profile, parent=parent))
    cards.sort(key=lambda c: c.index)
    topology = None
    if "links" in doc:
        topology = _decode_links(doc["links"], len(cards), what)
    return Inventory(cards=tuple(cards), topology=topology)


def _decode_links(raw: Any, count: int, what: str) -> Topology:
    where = _path(what, "links")
    if not isinstance(raw, list) or len(raw) != count:
        raise AnnotationError(f"{where}: expected a {count}x{count} matrix (one row per card)")
    rows: list[tuple[LinkLevel, ...]] = []
    for i, row in enumerate(raw):
        if not isinstance(row, list) or len(row) != count:
            raise AnnotationError(f"{where}[{i}]: expected {count} link levels")
        levels: list[LinkLevel] = []
        for j, value in enumerate(row):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= max(LinkLevel):
                raise AnnotationError(f"{where}[{i}][{j}]: expected a link level 0..{int(max(LinkLevel))}")
            if (i == j) != (value == LinkLevel.SELF):
                raise AnnotationError(f"{where}[{i}][{j}]: level 0 (self) belongs on the diagonal only")
            levels.append(LinkLevel(value))
        rows.append(tuple(levels))
    for i in range(count):
        for j in range(count):
            if rows[i][j] != rows[j][i]:
                raise AnnotationError(f"{where}: not symmetric at [{i}][{j}]")
    return Topology(tuple(rows))


# ----------------------------------------------------------------------------------- assignment
@dataclass(frozen=True)
class CardRef:
    """One card of one container's assignment, named both ways (index for humans, uuid for safety)."""

    index: int
    uuid: str
    memory_mib: int
    compute: int
    exclusive: bool = False
    devices: int = 1
    """How many devices the container sees this card as (more than 1: a virtual card)."""


@dataclass(frozen=True)
class ContainerCards:
    """The cards one container got, in the order they are exposed to it."""

    name: str
    cards: tuple[CardRef, ...]
    init: bool = False


@dataclass(frozen=True)
class Assignment:
    """The decoded ``assignment-v1`` value."""

    node: str
    time: dt.datetime
    containers: tuple[ContainerCards, ...]
    pod_uid: str = ""
    """The uid of the pod the cards were decided for ("" in documents written before v1.1)."""

    @staticmethod
    def from_placement(placement: Placement, spec: NodeSpec, when: dt.datetime, pod_uid: str = "") -> Assignment:
        """Name the core's card positions by the node's card index and uuid; ``pod_uid`` names the pod."""
        containers = tuple(
            ContainerCards(
                name=a.container, init=a.init,
                cards=tuple(CardRef(index=spec.cards[s.card].index, uuid=spec.cards[s.card].uuid,
                                    memory_mib=s.memory_mib, compute=s.compute, exclusive=s.exclusive,
                                    devices=s.devices)
                            for s in a.slices),
            )
            for a in placement.containers
        )
        return Assignment(node=spec.name, time=when, containers=containers, pod_uid=pod_uid)

    def to_placement(self, pod_key: str, spec: NodeSpec, cpu_milli: int, memory_mib: int) -> Placement:
        """Back to card positions of ``spec``; raises :class:`AnnotationError` if a card is unknown.

        The uuid must match the card at that index: if the node's cards changed (a card replaced),
        the old assignment does not silently move to the new card.
        """
        position = {card.index: pos for pos, card in enumerate(spec.cards)}
        containers: list[ContainerAssignment] = []
        for c in self.containers:
            slices: list[CardSlice] = []
            for ref in c.cards:
                pos = position.get(ref.index)
                if pos is None or spec.cards[pos].uuid != ref.uuid:
                    raise AnnotationError(
                        f"assignment-v1: node {spec.name} has no card {ref.index} with uuid {ref.uuid}")
                slices.append(CardSlice(card=pos, memory_mib=ref.memory_mib, compute=ref.compute,
                                        exclusive=ref.exclusive, devices=ref.devices))
            containers.append(ContainerAssignment(container=c.name, slices=tuple(slices), init=c.init))
        return Placement(pod_key=pod_key, node=spec.name, cpu_milli=cpu_milli, memory_mib=memory_mib,
                         containers=tuple(containers))


def foreign_assignment(decided_for: str, uid: str) -> str | None:
    """Why an assignment whose ``podUID`` is ``decided_for`` may not serve the pod of ``uid`` (None
    when it may: same uid, or a document written before ``podUID`` existed)."""
    if not decided_for or decided_for == uid:
        return None
    return (f"assignment-v1 was decided for pod uid {decided_for}, not this pod (uid {uid}): the pod was "
            "replaced under its name before its Binding; delete it and let its controller recreate it")


def encode_assignment(assignment: Assignment) -> str:
    """The compact JSON of an ``assignment-v1`` value."""
    doc = {
        "v": SCHEMA_VERSION,
        "node": assignment.node,
        "time": format_time(assignment.time),
        **({"podUID": assignment.pod_uid} if assignment.pod_uid else {}),
        "containers": [
            {"name": c.name, "init": c.init,
             "cards": [{**_card_doc(r), "exclusive": r.exclusive, **_devices_doc(r)} for r in c.cards]}
            for c in assignment.containers
        ],
    }
    return json.dumps(doc, separators=(",", ":"))


def _devices_doc(ref: CardRef) -> dict[str, Any]:
    """The optional ``devices`` of an assignment's card entry: written only for a virtual card, so a
    plain assignment stays byte for byte what v1.1 writers wrote."""
    return {"devices": ref.devices} if ref.devices != 1 else {}


def _devices(card: Mapping[str, Any], where: str) -> int:
    """An assignment card entry's ``devices`` (1 when absent), 1..:data:`MAX_VIRTUAL_DEVICES`."""
    if "devices" not in card:
        return 1
    count = bounded(card, "devices", where, MAX_VIRTUAL_DEVICES)
    if count < 1:
        raise AnnotationError(f"{where}.devices: a card is at least 1 device, got {count}")
    return count


def decode_assignment(value: str) -> Assignment:
    """Validate and decode an ``assignment-v1`` value."""
    what = "assignment-v1"
    doc = load_document(value, what)
    node = text(doc, "node", what)
    when = parse_time(read_field(doc, "time", str, what), f"{what}.time")
    pod_uid = text(doc, "podUID", what) if "podUID" in doc else ""
    containers: list[ContainerCards] = []
    names: set[tuple[str, bool]] = set()
    for i, raw in enumerate(read_field(doc, "containers", list, what)):
        where = f"{what}.containers[{i}]"
        if not isinstance(raw, dict):
            raise AnnotationError(f"{where}: expected an object")
        name = text(raw, "name", where)
        init = read_field(raw, "init", bool, where)
        if (name, init) in names:
            raise AnnotationError(f"{where}.name: container {name!r} appears twice")
        names.add((name, init))
        refs: list[CardRef] = []
        for j, card in enumerate(_card_list(raw, where)):
            cw = f"{where}.cards[{j}]"
            refs.append(replace(_card_ref(card, cw), exclusive=read_field(card, "exclusive", bool, cw),
                                devices=_devices(card, cw)))
        if not refs:
            raise AnnotationError(f"{where}.cards: a container entry needs at least one card")
        if len({r.index for r in refs}) != len(refs):
            raise AnnotationError(f"{where}.cards: a card appears twice")
        containers.append(ContainerCards(name=name, cards=tuple(refs), init=init))
    return Assignment(node=node, time=when, containers=tuple(containers), pod_uid=pod_uid)


# ------------------------------------------------------------------------------------ allocated
@dataclass(frozen=True)
class AllocatedContainer:
    """One container as the node served it: its cards (index, uuid, slice) and device counts."""

    name: str
    cards: tuple[CardRef, ...]
    init: bool = False
    resources: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Allocated:
    """The node side's confirmation that the pod's containers received their cards."""

    node: str
    time: dt.datetime
    containers: tuple[AllocatedContainer, ...] = ()


def encode_allocated(allocated: Allocated) -> str:
    """The compact JSON of an ``allocated-v1`` value (containers sorted by name: stable rewrites)."""
    doc: dict[str, Any] = {"v": SCHEMA_VERSION, "node": allocated.node, "time": format_time(allocated.time)}
    if allocated.containers:
        doc["containers"] = [
            {"name": c.name, "init": c.init,
             "cards": [_card_doc(r) for r in c.cards],
             "resources": dict(sorted(c.resources.items()))}
            for c in sorted(allocated.containers, key=lambda c: (c.name, c.init))
        ]
    return json.dumps(doc, separators=(",", ":"))


def decode_allocated(value: str) -> Allocated:
    """Validate and decode an ``allocated-v1`` value."""
    what = "allocated-v1"
    doc = load_document(value, what)
    node = text(doc, "node", what)
    when = parse_time(read_field(doc, "time", str, what), f"{what}.time")
    containers: list[AllocatedContainer] = []
    for i, raw in enumerate(read_field(doc, "containers", list, what) if "containers" in doc else []):
        where = f"{what}.containers[{i}]"
        if not isinstance(raw, dict):
            raise AnnotationError(f"{where}: expected an object")
        refs = [_card_ref(card, f"{where}.cards[{j}]") for j, card in enumerate(_card_list(raw, where))]
        raw_resources = read_field(raw, "resources", dict, where) if "resources" in raw else {}
        resources: dict[str, int] = {}
        for name in raw_resources:
            check_text(name, f"{where}.resources")
            resources[name] = bounded(raw_resources, name, f"{where}.resources", MAX_DEVICES_PER_RESOURCE)
        containers.append(AllocatedContainer(name=text(raw, "name", where), cards=tuple(refs),
                                             init=read_field(raw, "init", bool, where), resources=resources))
    return Allocated(node=node, time=when, containers=tuple(containers))
