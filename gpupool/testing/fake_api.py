"""An in-process stand-in for the apiserver's pod endpoints, faithful where binding safety depends on it.

It keeps one global resourceVersion counter like etcd, refuses a patch whose resourceVersion
precondition is stale (409), refuses to bind a pod that is already bound or whose uid or
resourceVersion differs (409; as apiservers from v1.23 do), merges a Binding's annotations into
the pod as it binds it, and tells subscribers about every change (the way a watch would), optionally late. Tests use
it to prove the race rules; ``bench/extender.py`` uses it when no real apiserver is available.

Every change is also kept in an event history (what etcd keeps until it compacts), which
:mod:`gpupool.testing.fake_watch` serves as list+watch, 410 Gone included.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from typing import Any

from gpupool.kube.podapi import ConflictError, NotFoundError, pod_event

PodListener = Callable[[str, dict[str, Any]], None]


class HistoryCompacted(Exception):
    """Events after the asked resourceVersion are gone (the apiserver answers 410 Gone)."""


class FakePodApi:
    """Pods in memory with resourceVersion semantics; thread-safe."""

    def __init__(self, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._rv = 0
        self._history: list[tuple[int, str, dict[str, Any]]] = []
        self._compacted_rv = 0
        self.listeners: list[PodListener] = []
        self.calls: list[str] = []
        self.events: list[dict[str, Any]] = []
        """Events created about pods (core/v1 Event JSON), oldest first."""
        #: Inject conflicts: the next N assignment writes (a patch, or a Binding that carries
        #: annotations) fail with 409 after ``before_conflict`` runs.
        self.conflicts_to_inject = 0
        self.before_conflict: Callable[[str, str], None] | None = None

    def _bump(self, pod: dict[str, Any], kind: str = "MODIFIED") -> None:
        """Next resourceVersion for ``pod`` and an event in the history; call with the lock held."""
        self._rv += 1
        pod["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append((self._rv, kind, copy.deepcopy(pod)))
        self._changed.notify_all()

    def _notify(self, kind: str, pod: dict[str, Any]) -> None:
        snapshot = copy.deepcopy(pod)
        for listener in list(self.listeners):
            listener(kind, snapshot)

    def _sleep(self) -> None:
        if self.latency_s:
            time.sleep(self.latency_s)

    # ------------------------------------------------------------------------------- test side
    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Store a new pod (uid and resourceVersion assigned) and announce it."""
        pod = copy.deepcopy(pod)
        meta = pod.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuidlib.uuid4()))
        pod.setdefault("spec", {})
        pod.setdefault("status", {"phase": "Pending"})
        with self._lock:
            key = (meta["namespace"], meta["name"])
            if key in self._pods:
                raise ConflictError(f"pod {key} already exists", 409)
            self._bump(pod, "ADDED")
            self._pods[key] = pod
            result = copy.deepcopy(pod)
        self._notify("ADDED", result)
        return result

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            pod = self._pods.pop((namespace, name), None)
            if pod is not None:
                self._bump(pod, "DELETED")
        if pod is not None:
            self._notify("DELETED", pod)

    def list_pods(self) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(p) for p in self._pods.values()]

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        with self._lock:
            return self._rv

    def compact(self) -> None:
        """Forget the event history, as etcd's compaction does: older watches get 410 Gone."""
        with self._lock:
            self._history.clear()
            self._compacted_rv = self._rv

    def events_after(self, resource_version: int, wait_s: float) -> list[tuple[int, str, dict[str, Any]]]:
        """Events newer than ``resource_version``, waiting up to ``wait_s`` for one.

        Raises :class:`HistoryCompacted` when events after that version were compacted away.
        """
        with self._lock:
            if resource_version < self._compacted_rv:
                raise HistoryCompacted(f"resourceVersion {resource_version} is older than "
                                       f"{self._compacted_rv}")
            if not self._history or self._history[-1][0] <= resource_version:
                self._changed.wait(wait_s)
            return [copy.deepcopy(e) for e in self._history if e[0] > resource_version]

    def version_before(self, namespace: str, name: str, resource_version: int) -> dict[str, Any] | None:
        """The pod as it was just before ``resource_version`` (from the event history), or ``None``
        when the history holds no earlier version of it (never existed, or compacted away)."""
        with self._lock:
            for version, _, obj in reversed(self._history):
                meta = obj["metadata"]
                if version < resource_version and (meta["namespace"], meta["name"]) == (namespace, name):
                    earlier: dict[str, Any] = copy.deepcopy(obj)
                    return earlier
            return None

    def wake(self) -> None:
        """Wake everyone waiting in :meth:`events_after`."""
        with self._lock:
            self._changed.notify_all()

    def touch_pod(self, namespace: str, name: str) -> None:
        """Any unrelated update (a label, a status change) that moves the resourceVersion on."""
        with self._lock:
            pod = self._pods[(namespace, name)]
            self._bump(pod)
            result = copy.deepcopy(pod)
        self._notify("MODIFIED", result)

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> None:
        """The kubelet's status update: the pod is ``Running``, ``Succeeded``, ``Failed``..."""
        with self._lock:
            pod = self._pods[(namespace, name)]
            pod.setdefault("status", {})["phase"] = phase
            self._bump(pod)
            result = copy.deepcopy(pod)
        self._notify("MODIFIED", result)

    def _injected_conflict(self, namespace: str, name: str) -> bool:
        """Whether this write is one of the injected conflicts (``before_conflict`` has run then)."""
        with self._lock:
            inject = self.conflicts_to_inject > 0
            if inject:
                self.conflicts_to_inject -= 1
        if inject and self.before_conflict is not None:
            self.before_conflict(namespace, name)
        return inject

    # --------------------------------------------------------------------------------- PodApi
    def get_pod(self, namespace: str, name: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        self._sleep()
        with self._lock:
            self.calls.append(f"get {namespace}/{name}")
            pod = self._pods.get((namespace, name))
            if pod is None:
                raise NotFoundError(f"pod {namespace}/{name} not found", 404)
            return copy.deepcopy(pod)

    def patch_pod_annotations(self, namespace: str, name: str, resource_version: str,
                              annotations: dict[str, str | None]) -> dict[str, Any]:
        self._sleep()
        inject = self._injected_conflict(namespace, name)
        with self._lock:
            self.calls.append(f"patch {namespace}/{name}")
            pod = self._pods.get((namespace, name))
            if pod is None:
                raise NotFoundError(f"pod {namespace}/{name} not found", 404)
            if inject or pod["metadata"]["resourceVersion"] != resource_version:
                raise ConflictError(f"Operation cannot be fulfilled on pods \"{name}\": the object has been "
                                    "modified; please apply your changes to the latest version", 409)
            current = pod["metadata"].setdefault("annotations", {})
            for key, value in annotations.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            self._bump(pod)
            result = copy.deepcopy(pod)
        self._notify("MODIFIED", result)
        return result

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, *,
                 annotations: Mapping[str, str] | None = None, resource_version: str = "") -> None:
        """Bind as an apiserver from v1.23 does: the uid and resourceVersion preconditions are
        checked (v1.20 ignores them), and the Binding's annotations are merged in the same write."""
        self._sleep()
        inject = self._injected_conflict(namespace, name) if annotations else False
        with self._lock:
            self.calls.append(f"bind {namespace}/{name} {node}")
            pod = self._pods.get((namespace, name))
            if pod is None:
                raise NotFoundError(f"pod {namespace}/{name} not found", 404)
            if inject:
                raise ConflictError(f"Operation cannot be fulfilled on pods/binding \"{name}\": injected", 409)
            if uid and pod["metadata"]["uid"] != uid:
                raise ConflictError(f"pod {namespace}/{name}: uid changed", 409)
            if resource_version and pod["metadata"]["resourceVersion"] != resource_version:
                raise ConflictError(f"Operation cannot be fulfilled on pods/binding \"{name}\": the object "
                                    "has been modified; please apply your changes to the latest version", 409)
            if pod["spec"].get("nodeName"):
                bound = pod["spec"]["nodeName"]
                raise ConflictError(f"pod {name} is already assigned to node \"{bound}\"", 409)
            pod["spec"]["nodeName"] = node
            if annotations:
                pod["metadata"].setdefault("annotations", {}).update(annotations)
            self._bump(pod)
            result = copy.deepcopy(pod)
        self._notify("MODIFIED", result)

    def create_pod_event(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        self._sleep()
        with self._lock:
            self.calls.append(f"event {namespace}/{name} {reason}")
            self.events.append(pod_event(namespace, name, uid, reason, message))
