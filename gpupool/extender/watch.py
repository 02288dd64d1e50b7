"""List+watch of nodes and pods into the :class:`ClusterCache` (the loop itself:
:mod:`gpupool.kube.listwatch`, shared with the node agent).
"""

from __future__ import annotations

import threading
from typing import Any

from gpupool.extender.cache import ClusterCache
from gpupool.kube.listwatch import ListWatch


def apply_node_event(cache: ClusterCache, kind: str, obj: dict[str, Any]) -> None:
    """One node event into the cache."""
    if kind == "DELETED":
        cache.remove_node(str((obj.get("metadata") or {}).get("name")))
    else:
        cache.upsert_node(obj)


def apply_pod_event(cache: ClusterCache, kind: str, obj: dict[str, Any]) -> None:
    """One pod event into the cache."""
    if kind == "DELETED":
        cache.remove_pod(obj)
    else:
        cache.upsert_pod(obj)


def start_watches(cache: ClusterCache, core_v1: Any, stop: threading.Event) -> tuple[ListWatch, ListWatch]:
    """Start the node and pod watches feeding ``cache``; returns them (for status and tests)."""
    nodes = ListWatch("nodes", core_v1.list_node, cache.replace_nodes,
                      lambda kind, obj: apply_node_event(cache, kind, obj), stop=stop).start()
    pods = ListWatch("pods", core_v1.list_pod_for_all_namespaces, cache.replace_pods,
                     lambda kind, obj: apply_pod_event(cache, kind, obj), stop=stop).start()
    return nodes, pods
