"""Cards held by pods that HAMi, Alibaba gpushare or Tencent GPUManager placed: read from the
annotations those systems' schedulers wrote, so gpupool books them instead of seeing free cards.

Why: a node is migrated to gpupool without draining it (docs/hami.md). The pods already running
there were placed by another scheduler and carry no ``assignment-v1``; without this module they hold
only CPU and memory in gpupool's ledger, and their cards would look free. Each system records the
cards it chose on the pod (formats read from their public documentation and sources, not copied):

* **HAMi** ``hami.io/vgpu-devices-allocated``: per container (in ``spec.containers`` order) a list
  ``UUID,Type,MiB,cores:`` (one entry per card, each ended by ``:``), containers ended by ``;``;
  ``hami.io/vgpu-node`` names the node. ``cores`` is a percentage of the card; 100 is the whole card.
* **gpushare** ``ALIYUN_COM_GPU_MEM_IDX``: the card index; ``ALIYUN_COM_GPU_MEM_POD``: the pod's
  memory in the plugin's unit (GiB, or MiB: ``ResourceNames.gpushare_unit_mib``), all on that card.
  ``ALIYUN_COM_GPU_MEM_ASSIGNED`` (``false`` until the device plugin served the pod) does not matter:
  a bound pod holds its card either way.
* **GPUManager** ``tencent.com/predicate-gpu-idx-<i>``: the card indices of container ``i``;
  ``tencent.com/predicate-node`` names the node. The amounts are the container's
  ``tencent.com/vcuda-core`` (percent; 100 or more: whole cards) and ``tencent.com/vcuda-memory``
  (256 MiB units) on its one card; ``tencent.com/vcuda-core-limit`` only caps use, never booking.

The rule when an annotation cannot be read: never treat a card as free while a pod may hold part of
it. A card that can be named (UUID or index) but whose share cannot be read is booked whole
(exclusive), and :attr:`Adoption.problem` says so. A value that names no card at all raises
:class:`AdoptionError`: the caller holds the pod's node as unreadable (no GPU pod placed there), as
for an ``assignment-v1`` that does not decode. Pure: no I/O, nothing logged here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.api import names as n
from gpupool.api.fields import shown
from gpupool.api.names import ResourceNames
from gpupool.core.model import CardSlice, ContainerAssignment, NodeSpec, Placement
from gpupool.core.units import COMPUTE_PER_CARD, MEMORY_UNIT_MIB
from gpupool.kube.quantity import QuantityError, parse_quantity

HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_NODE = "hami.io/vgpu-node"
GPUSHARE_INDEX = "ALIYUN_COM_GPU_MEM_IDX"
GPUSHARE_POD_MEMORY = "ALIYUN_COM_GPU_MEM_POD"
GPUMANAGER_INDEX_PREFIX = "tencent.com/predicate-gpu-idx-"
GPUMANAGER_NODE = "tencent.com/predicate-node"

HAMI, GPUSHARE, GPUMANAGER = "HAMi", "gpushare", "GPUManager"
PERCENT = 100
MAX_ANNOTATION_CHARS = 64 * 1024
"""Longer values are not read (a pod's annotations total at most 256 KiB in the API anyway)."""


class AdoptionError(ValueError):
    """A foreign annotation that names no card gpupool can book; says which and why."""


@dataclass(frozen=True)
class AdoptedCard:
    """One card a foreign system gave a container: named by UUID (HAMi) or index (the others).

    ``memory_mib`` None: the whole card, exclusive (the share is 100 % or could not be read)."""

    uuid: str | None
    index: int | None
    """Exactly one of ``uuid`` and ``index`` is given."""
    memory_mib: int | None
    compute: int = 0
    """Per-mille of the card (gpupool's unit)."""


@dataclass(frozen=True)
class AdoptedContainer:
    name: str
    cards: tuple[AdoptedCard, ...]


@dataclass(frozen=True)
class Adoption:
    """What a foreign system's annotations say one pod holds on its node."""

    system: str
    containers: tuple[AdoptedContainer, ...]
    node: str | None = None
    """The node the system's own annotation names (None where it names none: gpushare)."""
    problem: str | None = None
    """Why some card is booked whole rather than by the share written (None when all were read)."""

    def on(self, node: str) -> Adoption:
        """This adoption for a pod bound to ``node``: as it is where the system's own annotation names
        that node (or none), else every card whole with the reason (a stale or hand-edited value)."""
        if self.node is None or self.node == node:
            return self
        whole = tuple(AdoptedContainer(c.name, tuple(AdoptedCard(r.uuid, r.index, None) for r in c.cards))
                      for c in self.containers)
        why = (f"{self.system} placed the pod on node {self.node} but it is bound to {node}; its cards are "
               "booked whole there")
        return Adoption(self.system, whole, node, f"{self.problem}; {why}" if self.problem else why)

    def placement(self, pod_key: str, spec: NodeSpec, cpu_milli: int, memory_mib: int) -> Placement:
        """The cards on ``spec`` (the node the pod is bound to); raises :class:`AdoptionError` when
        a card is not on that node."""
        by_uuid = {card.uuid.lower(): pos for pos, card in enumerate(spec.cards)}
        by_index = {card.index: pos for pos, card in enumerate(spec.cards)}
        containers: list[ContainerAssignment] = []
        for c in self.containers:
            slices: list[CardSlice] = []
            for ref in c.cards:
                pos = by_uuid.get(ref.uuid.lower()) if ref.uuid is not None else by_index.get(ref.index or 0)
                if pos is None:
                    named = f"uuid {ref.uuid}" if ref.uuid is not None else f"index {ref.index}"
                    raise AdoptionError(f"{self.system} placed container {c.name} on card {named}, which node "
                                        f"{spec.name} does not have")
                card = spec.cards[pos]
                if ref.memory_mib is None:
                    slices.append(CardSlice(pos, card.memory_mib, card.compute, exclusive=True))
                else:
                    slices.append(CardSlice(pos, ref.memory_mib, ref.compute))
            containers.append(ContainerAssignment(container=c.name, slices=tuple(slices)))
        return Placement(pod_key=pod_key, node=spec.name, cpu_milli=cpu_milli, memory_mib=memory_mib,
                         containers=tuple(containers))


def adoption(raw: Mapping[str, Any], names: ResourceNames) -> Adoption | None:
    """What another system's annotations on the pod object ``raw`` say it holds; None when it
    carries none. Raises :class:`AdoptionError` for a value that names no card (see module doc)."""
    meta = raw.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        return None
    spec = raw.get("spec") or {}
    containers = [c if isinstance(c, Mapping) else {} for c in (spec.get("containers") or ())] \
        if isinstance(spec, Mapping) else []
    if HAMI_ALLOCATED in annotations:
        return _hami(annotations, containers)
    tencent = sorted(key for key in annotations if isinstance(key, str) and key.startswith(GPUMANAGER_INDEX_PREFIX))
    if tencent:
        return _gpumanager(annotations, tencent, containers)
    if GPUSHARE_INDEX in annotations:
        return _gpushare(annotations, containers, names)
    return None


# -------------------------------------------------------------------------------------- HAMi
def _hami(annotations: Mapping[str, Any], containers: Sequence[Mapping[str, Any]]) -> Adoption:
    text = _text(annotations, HAMI_ALLOCATED)
    parts = text.split(";")
    if parts and not parts[-1].strip():
        parts.pop()  # the terminator after the last container
    adopted: list[AdoptedContainer] = []
    problems: list[str] = []
    for i, part in enumerate(parts):
        cards: list[AdoptedCard] = []
        for entry in (e.strip() for e in part.split(":")):
            if entry:
                cards.append(_hami_card(entry, problems))
        if cards:
            adopted.append(AdoptedContainer(_container_name(containers, i), tuple(cards)))
    if not adopted:
        raise AdoptionError(f"{HAMI_ALLOCATED}={shown(text)} names no card (expected UUID,Type,MiB,cores: "
                            "per card and ; after each container)")
    return Adoption(HAMI, tuple(adopted), _node(annotations, HAMI_NODE), _problem(HAMI_ALLOCATED, problems))


def _hami_card(entry: str, problems: list[str]) -> AdoptedCard:
    fields = [f.strip() for f in entry.split(",")]
    uuid = fields[0]
    if not uuid or any(ch.isspace() for ch in uuid):
        raise AdoptionError(f"{HAMI_ALLOCATED}: device {shown(entry)} names no card UUID")
    memory = _int(fields[2]) if len(fields) >= 4 else None
    cores = _int(fields[3]) if len(fields) >= 4 else None
    if memory is None or cores is None or memory <= 0 or not 0 <= cores <= PERCENT:
        problems.append(f"device {shown(entry)} has no readable MiB,cores")
        return AdoptedCard(uuid, None, None)
    if cores == PERCENT:
        return AdoptedCard(uuid, None, None)
    return AdoptedCard(uuid, None, memory, cores * (COMPUTE_PER_CARD // PERCENT))


# ---------------------------------------------------------------------------------- gpushare
def _gpushare(annotations: Mapping[str, Any], containers: Sequence[Mapping[str, Any]],
              names: ResourceNames) -> Adoption:
    text = _text(annotations, GPUSHARE_INDEX)
    indices = _indices(text, GPUSHARE_INDEX)
    name = next((str(c.get("name") or "") for c in containers if n.ALIYUN_GPU_MEM in _limits(c)), "")
    name = name or _container_name(containers, 0)
    problems: list[str] = []
    memory = _int(_text(annotations, GPUSHARE_POD_MEMORY)) if GPUSHARE_POD_MEMORY in annotations else None
    if len(indices) > 1:
        problems.append(f"{shown(text)} names {len(indices)} cards, gpushare's extender writes one")
    elif memory is None or memory <= 0:
        problems.append(f"{GPUSHARE_POD_MEMORY}={shown(annotations.get(GPUSHARE_POD_MEMORY))} is no memory "
                        "amount")
    if problems:
        cards = tuple(AdoptedCard(None, i, None) for i in indices)
    else:
        cards = (AdoptedCard(None, indices[0], (memory or 0) * names.gpushare_unit_mib),)
    return Adoption(GPUSHARE, (AdoptedContainer(name, cards),), None, _problem(GPUSHARE_INDEX, problems))


# -------------------------------------------------------------------------------- GPUManager
def _gpumanager(annotations: Mapping[str, Any], keys: Sequence[str],
                containers: Sequence[Mapping[str, Any]]) -> Adoption:
    adopted: list[AdoptedContainer] = []
    problems: list[str] = []
    for key in keys:
        position = _int(key[len(GPUMANAGER_INDEX_PREFIX):])
        indices = _indices(_text(annotations, key), key)
        if position is None or not 0 <= position < len(containers):
            problems.append(f"{key} names no container of the pod")
            adopted.append(AdoptedContainer(key[len(GPUMANAGER_INDEX_PREFIX):],
                                            tuple(AdoptedCard(None, i, None) for i in indices)))
            continue
        limits = _limits(containers[position])
        core = _amount(limits.get(n.TENCENT_VCUDA_CORE))
        units = _amount(limits.get(n.TENCENT_VCUDA_MEMORY))
        share = core is not None and 0 <= core < PERCENT and units is not None and units > 0 and len(indices) == 1
        if not share and (core is None or core < PERCENT):
            problems.append(f"{key}: container {_container_name(containers, position)} has no readable "
                            f"{n.TENCENT_VCUDA_CORE} below 100 with {n.TENCENT_VCUDA_MEMORY} on one card")
        if share:
            cards: tuple[AdoptedCard, ...] = (AdoptedCard(None, indices[0], (units or 0) * MEMORY_UNIT_MIB,
                                                          (core or 0) * (COMPUTE_PER_CARD // PERCENT)),)
        else:
            cards = tuple(AdoptedCard(None, i, None) for i in indices)
        adopted.append(AdoptedContainer(_container_name(containers, position), cards))
    return Adoption(GPUMANAGER, tuple(adopted), _node(annotations, GPUMANAGER_NODE),
                    _problem("GPUManager", problems))


# ----------------------------------------------------------------------------------- helpers
def _text(annotations: Mapping[str, Any], key: str) -> str:
    value = annotations.get(key)
    if not isinstance(value, str) or len(value) > MAX_ANNOTATION_CHARS:
        raise AdoptionError(f"{key}={shown(value)} is not a readable annotation value")
    return value.strip()


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 12 else None


def _indices(text: str, key: str) -> list[int]:
    found = [_int(part) for part in text.split(",")]
    indices = [i for i in found if i is not None]
    if not indices or len(indices) != len(found):
        raise AdoptionError(f"{key}={shown(text)} is no card index (expected 0, 1, ...)")
    return indices


def _node(annotations: Mapping[str, Any], key: str) -> str | None:
    value = annotations.get(key)
    return value if isinstance(value, str) and value else None


def _limits(container: Mapping[str, Any]) -> Mapping[str, Any]:
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return {}
    for part in ("limits", "requests"):
        found = resources.get(part)
        if isinstance(found, Mapping) and found:
            return found
    return {}


def _amount(value: Any) -> int | None:
    if value is None:
        return None
    try:
        q = parse_quantity(value)
    except QuantityError:
        return None
    return int(q) if q == q.to_integral_value() and 0 <= q < 1 << 40 else None


def _container_name(containers: Sequence[Mapping[str, Any]], i: int) -> str:
    name = containers[i].get("name") if i < len(containers) else None
    return name if isinstance(name, str) and name else f"container-{i}"


def _problem(key: str, problems: list[str]) -> str | None:
    if not problems:
        return None
    return f"{key}: {'; '.join(problems)}; the whole card is booked instead, so no pod is placed on its memory"
