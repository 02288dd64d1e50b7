"""An in-memory stand-in for the API server's pods (tests, benchmarks, ``--fake-api`` demos).

Stores pods as JSON like the API does and applies merge-patches of annotations, so the node agent's
writes can be asserted on exactly as they would appear in a cluster.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gpupool.api.names import ResourceNames
from gpupool.nodeagent.pod_view import pod_view_from_json
from gpupool.nodeagent.types import PodView


class InMemoryPodSource:
    """Pods by (namespace, name); ``get`` converts to :class:`PodView` on each read."""

    def __init__(self, names: ResourceNames) -> None:
        self.names = names
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._views: dict[tuple[str, str], PodView] = {}

    def put(self, pod: Mapping[str, Any]) -> None:
        """Create or replace a pod."""
        meta = pod["metadata"]
        key = (str(meta.get("namespace", "default")), str(meta["name"]))
        self.pods[key] = copy.deepcopy(dict(pod))
        self._views.pop(key, None)

    def delete(self, namespace: str, name: str) -> None:
        self.pods.pop((namespace, name), None)
        self._views.pop((namespace, name), None)

    async def get(self, namespace: str, name: str) -> PodView | None:
        """The pod's view (cached until the pod changes)."""
        key = (namespace, name)
        view = self._views.get(key)
        if view is None and key in self.pods:
            view = pod_view_from_json(self.pods[key], self.names)
            self._views[key] = view
        return view

    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge annotations into the stored pod."""
        pod = self.pods.get((namespace, name))
        if pod is None:
            return
        pod.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
        self._views.pop((namespace, name), None)

    def annotation(self, namespace: str, name: str, key: str) -> str | None:
        """Read one annotation back (tests)."""
        pod = self.pods.get((namespace, name)) or {}
        value = (pod.get("metadata", {}).get("annotations") or {}).get(key)
        return None if value is None else str(value)
