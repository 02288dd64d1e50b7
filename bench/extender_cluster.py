"""The benchmark's cluster: ``--nodes`` nodes of identical cards in a synced extender cache, partly
filled with slices, and the pods it asks about (gpupool's own resources, several shapes)."""

from __future__ import annotations

import random
import time
from typing import Any

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.core.model import GpuCard
from gpupool.extender.cache import ClusterCache
from gpupool.kube.translate import pod_request

CARD_MIB = 16276
# gpupool's own resources, the path every gpupool pod takes (gpu-mem counts 256 MiB units per card).
SHAPES = [
    {"gpupool.io/gpu-mem": "8"},
    {"gpupool.io/gpu-mem": "16"},
    {"gpupool.io/gpu-mem": "31"},
    {"gpupool.io/gpu-core": "25"},
    {"gpupool.io/gpu-core": "50", "gpupool.io/gpu-mem": "23"},
    {"gpupool.io/gpu": "1"},
    {"gpupool.io/gpu": "2"},
]


def node_json(name: str, cards: int) -> dict[str, Any]:
    inventory = Inventory(tuple(GpuCard(i, f"GPU-{name}-{i}", "A100", CARD_MIB) for i in range(cards)))
    caps = {"cpu": "96", "memory": "768Gi", "pods": "250"}
    return {
        "metadata": {"name": name, "annotations": {"gpupool.io/inventory-v1": encode_inventory(inventory)}},
        "status": {"capacity": caps, "allocatable": caps},
    }


def pod_json(name: str, limits: dict[str, str], namespace: str = "default") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {
            "containers": [
                {"name": "main", "image": "x", "resources": {"limits": limits, "requests": {"cpu": "1"}}}
            ]
        },
    }


def build_cache(
    nodes: int, cards: int, fill: float, rng: random.Random, timings: dict[str, float] | None = None
) -> tuple[ClusterCache, list[str]]:
    """A synced cache of ``nodes`` nodes, ``fill`` of their cards holding a slice.

    ``timings`` receives ``ledger_s`` (the node list into the ledger, as at the extender's start)
    and ``fill_s`` (booking the slices one by one through the binder's reservation path).
    """
    cache = ClusterCache(policy="gpupool")
    names = [f"node-{i:05d}" for i in range(nodes)]
    listed = [node_json(n, cards) for n in names]  # what the node list delivers, not timed
    started = time.perf_counter()
    cache.replace_nodes(listed)
    cache.replace_pods([])
    booked = time.perf_counter()
    filled = 0
    target = int(fill * nodes * cards)
    i = 0
    while filled < target:  # half fill with slices, booked straight into the ledger
        request = pod_request(pod_json(f"fill-{i}", rng.choice(SHAPES[:5])), cache.names)
        node = names[rng.randrange(nodes)]
        decision = cache.reserve(request, node)
        i += 1
        if hasattr(decision, "containers"):
            filled += 1
    if timings is not None:
        timings["ledger_s"] = booked - started
        timings["fill_s"] = time.perf_counter() - booked
    return cache, names
