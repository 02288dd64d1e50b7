"""Fill the container directory from the watch of this node's pods.

A process's cgroup names its runtime container ID; the pod's ``status.containerStatuses[]`` (and
``initContainerStatuses[]``) name the same ID as ``<runtime>://<id>`` next to the container's name,
and ``metadata.uid`` matches the pod UID in the cgroup path. :func:`pod_containers` reads them; the
agent's pod cache calls it once per pod event, into the record it hands every feed
(:class:`gpupool.nodeagent.node_pod.NodePod`). :class:`DirectoryFeed` is one of those feeds: called on
the pod watch's own thread (the directory locks), it takes the IDs from the record and reads no raw
pod itself. It asks of the record only its ``containers`` and whether it asks for a GPU, gpupool's or
another device plugin's (:class:`DecodedPod`), so this package knows nothing of the agent's pod view.
The first full list also marks the directory listed (until then no pod is known: docs/monitor.md,
"Before the pod watch has listed").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory

log = logging.getLogger(__name__)

_STATUS_KEYS = ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")


@dataclass(frozen=True)
class PodContainers:
    """A pod's identity and its containers' runtime IDs (name → ``<runtime>://<id>``; empty until
    the container was created)."""

    uid: str
    namespace: str
    name: str
    containers: Mapping[str, str]


def pod_containers(obj: Mapping[str, Any]) -> PodContainers | None:
    """The containers of a pod as JSON; ``None`` for an object without a UID or name."""
    meta = obj.get("metadata") or {}
    uid, name = meta.get("uid"), meta.get("name")
    if not isinstance(uid, str) or not uid or not isinstance(name, str) or not name:
        return None
    status = obj.get("status") or {}
    containers: dict[str, str] = {}
    for key in _STATUS_KEYS:
        for entry in status.get(key) or []:
            if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                containers[entry["name"]] = str(entry.get("containerID") or "")
    return PodContainers(uid, str(meta.get("namespace", "default")), name, containers)


class DecodedPod(Protocol):
    """A pod as the pod cache decoded it: this feed reads only its containers."""

    @property
    def containers(self) -> PodContainers | None:
        """The runtime IDs (:func:`pod_containers`); None for an object without a UID or name."""
        ...

    @property
    def asks_gpus(self) -> bool:
        """Whether the pod booked or asked for a GPU, gpupool's or another device plugin's (or cannot be
        read well enough to tell)."""
        ...


class DirectoryFeed:
    """Keeps an :class:`InMemoryContainerDirectory` equal to the watched pods' containers."""

    def __init__(self, directory: InMemoryContainerDirectory) -> None:
        self.directory = directory
        self._uids: set[str] = set()

    def on_list(self, pods: Iterable[DecodedPod]) -> None:
        """A full list: the directory becomes exactly these pods, and is listed from now on."""
        listed = [(p.containers, p.asks_gpus) for p in pods if p.containers is not None]
        for uid in self._uids - {pod.uid for pod, _ in listed}:
            self.directory.remove_pod(uid)
        self._uids = set()
        for pod, asks_gpus in listed:
            self._add(pod, asks_gpus)
        self.directory.mark_listed()

    def on_event(self, kind: str, obj: DecodedPod) -> None:
        """A watch event: ``ADDED``/``MODIFIED`` records the pod, ``DELETED`` forgets it."""
        pod = obj.containers
        if pod is None:
            return
        if kind == "DELETED":
            self.directory.remove_pod(pod.uid)
            self._uids.discard(pod.uid)
        else:
            self._add(pod, obj.asks_gpus)

    def _add(self, pod: PodContainers, asks_gpus: bool) -> None:
        self.directory.remove_pod(pod.uid)  # a restarted container has a new ID; drop the old one
        self.directory.add(pod.uid, pod.namespace, pod.name, dict(pod.containers), asks_gpus=asks_gpus)
        self._uids.add(pod.uid)
