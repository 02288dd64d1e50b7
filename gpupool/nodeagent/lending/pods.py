"""What the lending rules need to know about the node's pods, kept from the agent's pod watch.

The rules run on the event source's thread while an opener may be waiting, so they cannot ask the
API: this feed (one more :class:`~gpupool.nodeagent.pod_cache.PodFeed` of the agent's watch) keeps,
per pod, its priority reading, whether it is a borrower and of whom, which cards its own
assignment books per container, its checkpoint key and its containers' runtime IDs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.annotations import AnnotationError
from gpupool.api.lending import (
    DEFAULT_HIGH_PRIORITY_THRESHOLD,
    LendingNames,
    Priority,
    hami_task_priority,
    is_borrowed,
    pod_priority,
)
from gpupool.api.names import ResourceNames
from gpupool.nodeagent.assignment_codec import node_assignment
from gpupool.nodeagent.containers.pod_containers import pod_containers

log = logging.getLogger(__name__)

PodKey = tuple[str, str]


@dataclass(frozen=True)
class LendingPod:
    """One pod as the lending side sees it."""

    namespace: str
    name: str
    uid: str
    priority: Priority
    borrowed: bool
    borrowed_from: str
    booked: Mapping[str, frozenset[int]]
    """Container → the card indices its assignment books."""
    cards: Mapping[str, tuple[int, ...]]
    """Container → those cards in the order the container sees them (CUDA ordinal 0 first)."""
    checkpoint_key: str
    container_ids: Mapping[str, str]
    """Container → runtime container ID (``<runtime>://`` stripped; empty until created)."""

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.name)


def checkpoint_key(meta: Mapping[str, Any], names: LendingNames) -> str:
    """The task a pod belongs to: its annotation, else its controller's UID, else namespace/name."""
    annotations = meta.get("annotations") or {}
    said = annotations.get(names.checkpoint_key)
    if isinstance(said, str) and said.strip():
        return said.strip()
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and isinstance(ref.get("uid"), str) and ref["uid"]:
            return str(ref["uid"])
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def lending_pod(obj: Mapping[str, Any], resources: ResourceNames, names: LendingNames,
                threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD) -> LendingPod | None:
    """Read one pod (JSON); ``None`` when it has no name or UID."""
    ids = pod_containers(obj)
    if ids is None:
        return None
    meta = obj.get("metadata") or {}
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    spec_priority = (obj.get("spec") or {}).get("priority")
    if not isinstance(spec_priority, int) or isinstance(spec_priority, bool):
        spec_priority = None
    cards: dict[str, tuple[int, ...]] = {}
    raw = annotations.get(resources.assignment)
    if raw:
        try:
            assignment = node_assignment(raw, f"{ids.namespace}/{ids.name}")
            cards = {c.container: tuple(s.card for s in c.slices) for c in assignment.placement.containers}
        except AnnotationError as exc:
            log.debug("lending: %s", exc)
    return LendingPod(namespace=ids.namespace, name=ids.name, uid=ids.uid,
                      priority=pod_priority(spec_priority, annotations, threshold=threshold, names=names,
                                            task_priority=hami_task_priority(obj.get("spec"))),
                      borrowed=is_borrowed(annotations, names),
                      borrowed_from=annotations.get(names.borrowed_from, ""),
                      booked={k: frozenset(v) for k, v in cards.items()}, cards=cards,
                      checkpoint_key=checkpoint_key(meta, names),
                      container_ids={k: v.partition("://")[2] or v for k, v in ids.containers.items()})


class LendingPods:
    """The feed and its thread-safe lookups."""

    def __init__(self, resources: ResourceNames, names: LendingNames,
                 threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD) -> None:
        self._resources = resources
        self._names = names
        self._threshold = threshold
        self._lock = threading.Lock()
        self._pods: dict[PodKey, LendingPod] = {}
        self.synced = False
        """Whether a full list arrived (before it, a missing pod may merely be unknown yet)."""

    def on_list(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full list: exactly these pods."""
        pods = [p for p in (lending_pod(o, self._resources, self._names, self._threshold) for o in items) if p]
        with self._lock:
            self._pods = {p.key: p for p in pods}
            self.synced = True

    def on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A watch event."""
        pod = lending_pod(obj, self._resources, self._names, self._threshold)
        if pod is None:
            return
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(pod.key, None)
            else:
                self._pods[pod.key] = pod

    def get(self, key: PodKey) -> LendingPod | None:
        """The pod, if the watch has it."""
        with self._lock:
            return self._pods.get(key)

    def all(self) -> list[LendingPod]:
        """Every pod the watch has now."""
        with self._lock:
            return list(self._pods.values())

    def borrowers_of(self, owner: str) -> list[LendingPod]:
        """Pods marked as borrowing from ``owner`` (``namespace/name``)."""
        with self._lock:
            return [p for p in self._pods.values() if p.borrowed and p.borrowed_from == owner]
