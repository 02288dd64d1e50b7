"""Container ID → (namespace, pod, container): the port the node agent fills from what it knows.

The node agent learns containers from its pod source (``status.containerStatuses[].containerID``,
``<runtime>://<id>``) and devices per container from kubelet's PodResources; it feeds them here,
with whether each pod asked for a GPU, gpupool's or another device plugin's (a pod that asked for
none, in an infrastructure namespace, is an infrastructure holder: docs/monitor.md, "Infrastructure
pods"), and whether the watch has listed the node's pods once (until then no pod is known).
The in-memory directory is both the tests' implementation and the one the agent keeps updated.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ContainerRef:
    """A container of a pod, by names."""

    namespace: str
    pod: str
    container: str


class ContainerDirectory(Protocol):
    """Answers which pod container a runtime container ID, or a pod UID, belongs to."""

    def container(self, container_id: str) -> ContainerRef | None:
        """The container with this runtime ID (bare, without ``<runtime>://``)."""
        ...

    def pod(self, pod_uid: str) -> tuple[str, str] | None:
        """(namespace, name) of the pod with this UID."""
        ...

    def asks_gpus(self, pod_uid: str) -> bool:
        """Whether the pod with this UID booked or asked for a GPU (gpupool's or another device
        plugin's); ``True`` for a pod not known."""
        ...

    def pod_uid(self, container_id: str) -> str:
        """The UID of the pod the container with this runtime ID belongs to; "" when not known."""
        ...


def bare_container_id(status_id: str) -> str:
    """``containerd://abc`` (a pod status's form) → ``abc``; a bare id is returned as is."""
    return status_id.split("://", 1)[-1]


class InMemoryContainerDirectory:
    """A :class:`ContainerDirectory` kept up to date by whoever watches the pods."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._containers: dict[str, ContainerRef] = {}
        self._pods: dict[str, tuple[str, str]] = {}
        self._ids_of: dict[str, set[str]] = {}
        """Per pod UID, the container IDs recorded for it: a pod is forgotten by its own IDs, so
        forgetting costs its containers, not the node's, and a pod replaced under the same name
        (a StatefulSet's) keeps its containers when the old pod's delete arrives after it."""
        self._uid_of: dict[str, str] = {}
        """Container ID → its pod's UID."""
        self._gpuless: set[str] = set()
        """UIDs of the pods known to have asked for no GPU at all (the infrastructure namespaces'
        candidates: docs/monitor.md, "Infrastructure pods"); a pod not here counts as asking."""
        self._listed = False

    @property
    def listed(self) -> bool:
        """Whether the pod watch has listed the node's pods once (before, no pod is known)."""
        with self._lock:
            return self._listed

    def mark_listed(self) -> None:
        """The pod watch's first full list is in (every pod it named is added)."""
        with self._lock:
            self._listed = True

    def add(self, pod_uid: str, namespace: str, pod: str, containers: dict[str, str], *,
            asks_gpus: bool = True) -> None:
        """Record a pod and its containers (name → status container ID, any form), and whether it
        booked or asked for a GPU, gpupool's or another's (when in doubt: it did)."""
        with self._lock:
            self._pods[pod_uid] = (namespace, pod)
            if asks_gpus:
                self._gpuless.discard(pod_uid)
            else:
                self._gpuless.add(pod_uid)
            ids = self._ids_of.setdefault(pod_uid, set())
            for name, status_id in containers.items():
                if status_id:
                    container_id = bare_container_id(status_id)
                    self._containers[container_id] = ContainerRef(namespace, pod, name)
                    self._uid_of[container_id] = pod_uid
                    ids.add(container_id)

    def remove_pod(self, pod_uid: str) -> None:
        """Forget a pod and its containers."""
        with self._lock:
            self._pods.pop(pod_uid, None)
            self._gpuless.discard(pod_uid)
            for container_id in self._ids_of.pop(pod_uid, ()):
                self._containers.pop(container_id, None)
                self._uid_of.pop(container_id, None)

    def container(self, container_id: str) -> ContainerRef | None:
        """The container with this runtime ID."""
        with self._lock:
            return self._containers.get(container_id)

    def pod(self, pod_uid: str) -> tuple[str, str] | None:
        """(namespace, name) of the pod with this UID."""
        with self._lock:
            return self._pods.get(pod_uid)

    def asks_gpus(self, pod_uid: str) -> bool:
        """Whether the pod with this UID booked or asked for a GPU; ``True`` for a pod not known."""
        with self._lock:
            return pod_uid not in self._gpuless

    def pod_uid(self, container_id: str) -> str:
        """The UID of the pod the container with this runtime ID belongs to; "" when not known."""
        with self._lock:
            return self._uid_of.get(container_id, "")
