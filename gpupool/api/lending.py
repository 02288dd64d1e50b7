"""The lending contract between the node agent and the extender: names, the node's lendable-capacity
annotation, the borrower marks, the priority reading and the checkpoint protocol's environment.

A card whose owner holds it without using it (the usage monitor's "idle") is lent: the node agent
publishes it on its Node (:attr:`LendingNames.lendable`, :class:`Lendable`), advertises device IDs
prefixed :data:`LEND_DEVICE_PREFIX` so that kubelet admits a borrower, and the extender binds
borrowers onto it with :attr:`LendingNames.borrowed` and :attr:`LendingNames.borrowed_from`. When
the owner opens the card again the agent reclaims it: checkpoint signal, deadline, kill, eviction.
Both sides import this module; nothing else defines these names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpupool.api.names import DEFAULT_DOMAIN

LENDABLE_VERSION = 1
"""Version of the ``lendable`` annotation's JSON; a reader refuses any other."""

LEND_DEVICE_PREFIX = "lend-"
"""kubelet device IDs of lent capacity: ``lend-`` + the ID the card's own device would have."""

BORROWED_TRUE = "true"

DEFAULT_HIGH_PRIORITY_THRESHOLD = 1000
"""A pod whose ``spec.priority`` is at least this is high priority (``--high-priority-threshold``)."""

# The checkpoint protocol (claim 6): what every container with a gpupool share finds in its env.
CHECKPOINT_DIR_ENV = "GPUPOOL_CHECKPOINT_DIR"
CHECKPOINT_SIGNAL_ENV = "GPUPOOL_CHECKPOINT_SIGNAL"
CHECKPOINT_DEADLINE_ENV = "GPUPOOL_CHECKPOINT_DEADLINE_S"
RESUME_FROM_ENV = "GPUPOOL_RESUME_FROM"
CHECKPOINT_MOUNT = "/var/run/gpupool/checkpoint"
"""Where the per-task checkpoint directory appears inside the container."""
CHECKPOINT_SIGNAL = "SIGUSR1"
DEFAULT_CHECKPOINT_DEADLINE_S = 10
PROCESS_CHECKPOINT = "process"
"""The value of :attr:`LendingNames.checkpoint` that routes the checkpoint signal to ``criu-run``."""

RECLAIMED_REASON = "GpuReclaimed"
"""Reason of the Warning event on a pod whose GPU was taken back (borrower or low priority)."""


class Priority(StrEnum):
    """Who wins at an open: the four rules compare the holder's and the asker's priority."""

    HIGH = "high"
    LOW = "low"


class LendingFormatError(ValueError):
    """A lending annotation that does not follow this contract; the message names the field."""


@dataclass(frozen=True)
class LendingNames:
    """The lending annotations under one domain (the same domain as :class:`ResourceNames`)."""

    domain: str = DEFAULT_DOMAIN

    @property
    def lendable(self) -> str:
        """Node annotation: the node's lendable cards (:class:`Lendable` as JSON)."""
        return f"{self.domain}/lendable"

    @property
    def borrowed(self) -> str:
        """Pod annotation ``"true"``: the pod was bound onto lent capacity (low priority)."""
        return f"{self.domain}/borrowed"

    @property
    def borrowed_from(self) -> str:
        """Pod annotation ``namespace/name`` of the owner whose card the pod borrows."""
        return f"{self.domain}/borrowed-from"

    @property
    def borrow(self) -> str:
        """Pod annotation ``true`` / ``false``: whether a low-priority pod may be placed on lent
        capacity (absent: when a controller owns it, which replaces it after a reclaim)."""
        return f"{self.domain}/borrow"

    @property
    def checkpoint_key(self) -> str:
        """Pod annotation: the task whose checkpoints the pod shares (its restarts find them)."""
        return f"{self.domain}/checkpoint-key"

    @property
    def checkpoint(self) -> str:
        """Pod annotation :data:`PROCESS_CHECKPOINT`: the pod's containers run under ``criu-run``, which
        dumps their processes itself, so a reclaim's checkpoint signal goes to each container's
        process 1 (the wrapper) only (docs/lending.md, "Process checkpoints with CRIU")."""
        return f"{self.domain}/checkpoint"

    @property
    def priority(self) -> str:
        """Pod annotation ``high`` or ``low``: overrides the pod's PriorityClass reading."""
        return f"{self.domain}/priority"


@dataclass(frozen=True)
class LendableCard:
    """One lent card: what the borrower may take of it and whose it is."""

    index: int
    uuid: str
    owner: str
    """``namespace/name`` of the owning pod."""
    owner_container: str
    memory_mib: int
    compute_percent: int
    idle_since: float


@dataclass(frozen=True)
class Lendable:
    """The node's lendable capacity at ``updated`` (unix seconds)."""

    updated: float
    cards: tuple[LendableCard, ...] = ()


def encode_lendable(value: Lendable) -> str:
    """The annotation value (compact JSON, cards by index)."""
    cards = [{"index": c.index, "uuid": c.uuid, "owner": c.owner, "ownerContainer": c.owner_container,
              "memoryMiB": c.memory_mib, "computePercent": c.compute_percent, "idleSince": c.idle_since}
             for c in sorted(value.cards, key=lambda c: c.index)]
    return json.dumps({"v": LENDABLE_VERSION, "updated": value.updated, "cards": cards},
                      separators=(",", ":"), sort_keys=True)


def decode_lendable(raw: str) -> Lendable:
    """Parse the annotation; :class:`LendingFormatError` names what is wrong."""
    try:
        doc = json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise LendingFormatError(f"lendable: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise LendingFormatError("lendable: expected a JSON object")
    if doc.get("v") != LENDABLE_VERSION:
        raise LendingFormatError(f"lendable: version {doc.get('v')!r} is not supported (expected {LENDABLE_VERSION})")
    cards_raw = doc.get("cards")
    if not isinstance(cards_raw, list):
        raise LendingFormatError("lendable.cards: expected a list")
    cards = tuple(_card(c, f"lendable.cards[{i}]") for i, c in enumerate(cards_raw))
    if len({c.index for c in cards}) != len(cards):
        raise LendingFormatError("lendable.cards: a card index appears twice")
    return Lendable(_number(doc, "updated", "lendable"), cards)


def _card(raw: Any, where: str) -> LendableCard:
    if not isinstance(raw, dict):
        raise LendingFormatError(f"{where}: expected an object")
    owner = _text(raw, "owner", where)
    if owner.count("/") != 1 or not all(owner.split("/")):
        raise LendingFormatError(f"{where}.owner: expected namespace/name, got {owner!r}")
    percent = _count(raw, "computePercent", where)
    if percent > 100:
        raise LendingFormatError(f"{where}.computePercent: {percent} is above 100")
    return LendableCard(index=_count(raw, "index", where), uuid=_text(raw, "uuid", where), owner=owner,
                        owner_container=_text(raw, "ownerContainer", where),
                        memory_mib=_count(raw, "memoryMiB", where), compute_percent=percent,
                        idle_since=_number(raw, "idleSince", where))


def _text(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise LendingFormatError(f"{where}.{key}: expected a non-empty string, got {value!r}")
    return value


def _count(raw: Mapping[str, Any], key: str, where: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise LendingFormatError(f"{where}.{key}: expected a whole number >= 0, got {value!r}")
    return value


def _number(raw: Mapping[str, Any], key: str, where: str) -> float:
    value = raw.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise LendingFormatError(f"{where}.{key}: expected seconds >= 0, got {value!r}")
    return float(value)


def is_borrowed(annotations: Mapping[str, str], names: LendingNames = LendingNames()) -> bool:
    """Whether a pod was bound onto lent capacity."""
    return annotations.get(names.borrowed, "").strip().lower() == BORROWED_TRUE


HAMI_TASK_PRIORITY = "nvidia.com/priority"
"""HAMi's per-container resource: the task's priority inside a time-shared card, 0 high, 1 low."""
HAMI_PRIORITIES = {0: Priority.HIGH, 1: Priority.LOW}


def hami_task_priority(spec: Any) -> Priority | None:
    """The priority a pod's containers ask with HAMi's ``nvidia.com/priority`` (limits, else
    requests): high when one of them says 0, low when they say only 1; None when none says 0 or 1
    (the extender refuses other values before the pod runs, :mod:`gpupool.kube.foreign`)."""
    said: set[Priority] = set()
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    for container in containers if isinstance(containers, list) else ():
        resources = container.get("resources") if isinstance(container, Mapping) else None
        for part in ("limits", "requests"):
            values = resources.get(part) if isinstance(resources, Mapping) else None
            value = values.get(HAMI_TASK_PRIORITY) if isinstance(values, Mapping) else None
            if value is not None:
                text = str(value).strip()
                if text.isdigit() and int(text) in HAMI_PRIORITIES:
                    said.add(HAMI_PRIORITIES[int(text)])
                break
    if not said:
        return None
    return Priority.HIGH if Priority.HIGH in said else Priority.LOW


def pod_priority(spec_priority: int | None, annotations: Mapping[str, str], *,
                 threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD,
                 names: LendingNames = LendingNames(), task_priority: Priority | None = None) -> Priority:
    """A pod's priority at open time: a borrower is low; else the annotation when it is ``high`` or
    ``low``; else ``task_priority`` (HAMi's ``nvidia.com/priority``, :func:`hami_task_priority`);
    else ``spec.priority`` (from its PriorityClass) against ``threshold``. An annotation with
    another value is ignored (the PriorityClass decides), never an error: a typo must not crash the
    agent's decider."""
    if is_borrowed(annotations, names):
        return Priority.LOW
    said = annotations.get(names.priority, "").strip().lower()
    if said in (Priority.HIGH, Priority.LOW):
        return Priority(said)
    if task_priority is not None:
        return task_priority
    return Priority.HIGH if spec_priority is not None and spec_priority >= threshold else Priority.LOW


def lend_device_id(device_id: str) -> str:
    """The lent twin of a card's own device ID (``g0-m3`` → ``lend-g0-m3``)."""
    return f"{LEND_DEVICE_PREFIX}{device_id}"


def lent_device_card_id(device_id: str) -> str | None:
    """The card's own device ID behind a lent one, ``None`` for any other ID."""
    return device_id[len(LEND_DEVICE_PREFIX):] if device_id.startswith(LEND_DEVICE_PREFIX) else None


BORROW_TRUE = "true"


def borrow_refusal(meta: Mapping[str, Any], priority: int | None, *,
                   threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD,
                   names: LendingNames = LendingNames(), spec: Any = None) -> str | None:
    """Why a pod (its ``metadata`` and ``spec.priority``) may not be placed on lent capacity, or None
    when it may: it must not opt out (``<domain>/borrow`` other than ``"true"``), must read low
    priority (:func:`pod_priority`, HAMi's priority read from ``spec``; a borrower is reclaimed when
    the owner returns), and without the annotation a controller must own it (a bare pod evicted by a
    reclaim would be lost). The
    extender's rule (:mod:`gpupool.extender.borrowing`) and ``kubectl gpupool why``'s."""
    annotations = meta.get("annotations") or {}
    said = str(annotations.get(names.borrow, "")).strip().lower()
    if said and said != BORROW_TRUE:
        return f"{names.borrow}: {said!r} (only \"true\" lets a pod borrow)"
    if pod_priority(priority, annotations, threshold=threshold, names=names,
                    task_priority=hami_task_priority(spec)) is Priority.HIGH:
        return "a high-priority pod does not borrow (a borrower is reclaimed when the owner returns)"
    if not said and not controlled(meta):
        return f"a pod without a controller borrows only with {names.borrow}: \"true\""
    return None


def controlled(meta: Mapping[str, object]) -> bool:
    """Whether a controller (ReplicaSet, Job, StatefulSet, ...) owns the pod."""
    owners = meta.get("ownerReferences") or []
    return isinstance(owners, list) and any(isinstance(o, Mapping) and o.get("controller") is True for o in owners)
