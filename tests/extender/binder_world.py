"""A binder and cache on a fake API whose changes reach the cache as a watch delivers them."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from gpupool.api.annotations import decode_assignment
from gpupool.api.names import ResourceNames
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.testing.fake_api import FakePodApi

ASSIGNMENT = ResourceNames().assignment
WRITES = [pytest.param(True, id="assignment-in-binding"), pytest.param(False, id="patch-then-binding")]
"""Both bind paths: the Binding that carries the assignment (one write), and the PATCH of the
assignment followed by the Binding (two writes, for apiservers that drop a Binding's annotations)."""


def world(
    nodes: list[dict[str, Any]], policy: str = "binpack", latency: float = 0.0, timeout: float = 300.0,
    one_write: bool = True,
) -> tuple[FakePodApi, ClusterCache, Binder]:
    """A fake API whose changes reach the cache the way a watch delivers them."""
    api = FakePodApi(latency_s=latency)
    cache = ClusterCache(policy=policy, unconfirmed_timeout_s=timeout)
    cache.replace_nodes(nodes)
    cache.replace_pods([])
    api.listeners.append(lambda kind, p: cache.remove_pod(p) if kind == "DELETED" else cache.upsert_pod(p))
    return api, cache, Binder(cache, api, annotate_in_binding=one_write)


def free_mib(cache: ClusterCache, name: str) -> list[int]:
    """Free memory of each card of node ``name`` as the ledger has it."""
    return [u.memory_free for u in cache.state.card_usage(name)]


def usage_from_annotations(api: FakePodApi) -> dict[tuple[str, int], int]:
    """Memory per (node, card index) summed over every pod's recorded assignment."""
    used: dict[tuple[str, int], int] = defaultdict(int)
    for p in api.list_pods():
        text = (p["metadata"].get("annotations") or {}).get(ASSIGNMENT)
        if text:
            a = decode_assignment(text)
            for c in a.containers:
                for ref in c.cards:
                    used[(a.node, ref.index)] += ref.memory_mib
    return used
