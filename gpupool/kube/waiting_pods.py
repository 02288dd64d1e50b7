"""The pods no node is bound to yet, listed from the API as its JSON.

A new extender leader adopts the GPU pods among them for the wake-up (its predecessor's refusals
died with it, :mod:`gpupool.extender.wakeup`). The field selector keeps the list to pending pods,
so a large cluster's running pods are not transferred again.
"""

from __future__ import annotations

import json
from typing import Any

UNBOUND = "spec.nodeName="
PAGE_SIZE = 500


def list_waiting_pods(core_v1: Any, page_size: int = PAGE_SIZE) -> list[dict[str, Any]]:
    """Every pod of every namespace bound to no node (paginated; raises what the API raises)."""
    pods: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"field_selector": UNBOUND, "limit": page_size, "_preload_content": False}
        if token:
            kwargs["_continue"] = token
        page = json.loads(core_v1.list_pod_for_all_namespaces(**kwargs).data)
        pods.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return pods
