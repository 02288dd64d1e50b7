"""What the lending rules need to know about the node's pods, kept from the agent's pod watch.

The rules run on the event source's thread while an opener may be waiting, so they cannot ask the
API: this feed (one more :class:`~gpupool.nodeagent.pod_cache.PodFeed` of the agent's watch) keeps,
per pod, its priority reading, whether it is a borrower and of whom, which cards its own
assignment books per container, its checkpoint key and its containers' runtime IDs.

It reads them from the record the pod cache decoded once (:class:`~gpupool.nodeagent.node_pod.NodePod`),
never from the raw pod: what is left here is the lending rules' own reading of those values (the
priority against the threshold, the borrower mark and checkpoint key under the lending names).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpupool.api.lending import (
    DEFAULT_HIGH_PRIORITY_THRESHOLD,
    LendingNames,
    Priority,
    is_borrowed,
    pod_priority,
)
from gpupool.nodeagent.node_pod import NodePod, PodKey


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


def checkpoint_key(pod: NodePod, names: LendingNames) -> str:
    """The task a pod belongs to: its annotation, else its controller's UID, else namespace/name."""
    said = pod.annotations.get(names.checkpoint_key, "").strip()
    return said or pod.controller_uid or f"{pod.namespace}/{pod.name}"


def lending_pod(pod: NodePod, names: LendingNames,
                threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD) -> LendingPod | None:
    """One pod as the lending side sees it; ``None`` when it has no UID."""
    ids = pod.containers
    if ids is None:
        return None
    cards: dict[str, tuple[int, ...]] = {}
    if pod.assignment is not None:
        cards = {c.container: tuple(s.card for s in c.slices) for c in pod.assignment.placement.containers}
    annotations = pod.annotations
    return LendingPod(namespace=ids.namespace, name=ids.name, uid=ids.uid,
                      priority=pod_priority(pod.spec_priority, annotations, threshold=threshold, names=names,
                                            task_priority=pod.task_priority),
                      borrowed=is_borrowed(annotations, names),
                      borrowed_from=annotations.get(names.borrowed_from, ""),
                      booked={k: frozenset(v) for k, v in cards.items()}, cards=cards,
                      checkpoint_key=checkpoint_key(pod, names),
                      container_ids={k: v.partition("://")[2] or v for k, v in ids.containers.items()})


class LendingPods:
    """The feed and its thread-safe lookups."""

    def __init__(self, names: LendingNames, threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD) -> None:
        self._names = names
        self._threshold = threshold
        self._lock = threading.Lock()
        self._pods: dict[PodKey, LendingPod] = {}
        self.synced = False
        """Whether a full list arrived (before it, a missing pod may merely be unknown yet)."""

    def on_list(self, items: Iterable[NodePod]) -> None:
        """A full list: exactly these pods."""
        pods = [p for p in (lending_pod(o, self._names, self._threshold) for o in items) if p]
        with self._lock:
            self._pods = {p.key: p for p in pods}
            self.synced = True

    def on_event(self, kind: str, obj: NodePod) -> None:
        """A watch event."""
        pod = lending_pod(obj, self._names, self._threshold)
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
