"""A pod's translated request, kept per pod uid while the fields the translation reads are unchanged.

Why: the extender translated every GPU pod four times (the watch's ADDED event, kube-scheduler's
filter call, the bind, the MODIFIED event after it), each from a fresh JSON object of the same pod
(and every bound CPU-only pod once per event, for its CPU and memory). A pod's containers, init containers and priority
cannot change after creation; what changes between those events is its status, node name and the
annotations gpupool writes itself (the assignment, the node agent's confirmation). So the request
translated from the first of them answers the others once a comparison shows the fields
:func:`gpupool.kube.translate.pod_request` reads are equal, which costs far less than translating.

Only pods with a uid are kept (objects from the apiserver), only successful translations (a pod
gpupool refuses is translated again and refused again with its reason), and at most
:data:`PODS_REMEMBERED` pods, the oldest dropped first.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from gpupool.api.names import ResourceNames
from gpupool.core.model import PodRequest
from gpupool.kube.translate import pod_request

PODS_REMEMBERED = 8192
"""Pods whose request is kept: enough for the pods pending and binding at once in a large cluster."""

Fingerprint = tuple[Any, ...]


class RequestMemo:
    """:func:`pod_request` of pod objects, remembered per uid (see the module docstring)."""

    def __init__(self, names: ResourceNames, capacity: int = PODS_REMEMBERED) -> None:
        self.names = names
        self.capacity = capacity
        self._written = frozenset({names.assignment, names.allocated, names.remote_share})
        """Annotations gpupool writes on a pod after its creation; the translation reads none."""
        self._entries: dict[str, tuple[Fingerprint, PodRequest]] = {}
        self._lock = threading.Lock()  # the watch thread and the event loop share it
        self.hits = 0

    def request(self, pod: Mapping[str, Any]) -> PodRequest:
        """``pod_request(pod, names)``; raises what it raises."""
        uid, fingerprint = self._fingerprint(pod)
        if uid is not None:
            found = self._entries.get(uid)
            if found is not None and found[0] == fingerprint:
                self.hits += 1
                return found[1]
        request = pod_request(pod, self.names)
        if uid is not None:
            with self._lock:
                self._entries.pop(uid, None)
                self._entries[uid] = (fingerprint, request)
                if len(self._entries) > self.capacity:
                    self._entries.pop(next(iter(self._entries)))
        return request

    def _fingerprint(self, pod: Mapping[str, Any]) -> tuple[str | None, Fingerprint]:
        """The pod's uid (None: not to be remembered) and the fields the translation reads."""
        meta = pod.get("metadata")
        spec = pod.get("spec")
        if not isinstance(meta, dict) or not isinstance(spec, dict):
            return None, ()
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            return None, ()
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and not self._written.isdisjoint(annotations):
            annotations = {k: v for k, v in annotations.items() if k not in self._written}
        priority = spec.get("priority")
        # the type too: 0 == False, and the translation refuses a boolean priority
        return uid, (meta.get("namespace"), meta.get("name"), annotations, meta.get("labels"),
                     spec.get("containers"), spec.get("initContainers"), type(priority), priority)
