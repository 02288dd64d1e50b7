"""The benchmark's tenancy objects: ``--groups`` resource groups over the cluster's nodes and GPUs,
``--quotas`` namespaces with a GpuQuota each, and the pods that use them (see bench/extender.py).

Groups split the nodes into equal runs; on every other node a group binds only half of the GPUs
(by UUID), so the group scopes mix whole nodes and single cards, and pods without a group are kept
off every GPU a group holds (the groups are unshared). Each quota limits its namespace overall and
on the cluster's GPU model, high enough that the benchmark's pods are never refused: what is
measured is the cost of the checks, not the refusals.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from bench.extender_cluster import SHAPES, pod_json
from gpupool.extender.cache import ClusterCache

PodMaker = Callable[[int], dict[str, Any]]


def group_objects(names: list[str], groups: int, cards: int) -> list[dict[str, Any]]:
    """``groups`` unshared ResourceGroups over consecutive runs of ``names``."""
    if not groups:
        return []
    per = max(1, len(names) // groups)
    found = []
    for g in range(groups):
        nodes = []
        for i, name in enumerate(names[g * per:(g + 1) * per]):
            half = [f"GPU-{name}-{c}" for c in range(cards // 2)]
            nodes.append({"name": name, "gpus": half} if i % 2 == 0 and half else {"name": name})
        found.append({"metadata": {"name": f"group-{g:03d}"}, "spec": {"shared": False, "nodes": nodes}})
    return found


def quota_objects(quotas: int, model: str = "A100") -> list[dict[str, Any]]:
    """``quotas`` GpuQuotas, one per namespace ``tenant-NNNN``."""
    return [{"metadata": {"name": "gpus", "namespace": f"tenant-{q:04d}"},
             "spec": {"hard": {"memoryMiB": 1 << 30, "computePercent": 1 << 20, "wholeGpus": 1 << 16},
                      "models": {model: {"computePercent": 1 << 20}}}} for q in range(quotas)]


def install(cache: ClusterCache, names: list[str], groups: int, quotas: int, cards: int) -> None:
    """Put the tenancy objects into the cache's book (as the watches would)."""
    with cache.lock:
        cache.tenancy.replace_groups(group_objects(names, groups, cards))
        cache.tenancy.replace_quotas(quota_objects(quotas))
        cache.tenancy.replace_namespaces([])


def tenant_pods(rng: random.Random, groups: int, quotas: int) -> PodMaker:
    """Pods of random shapes, each in a random quota's namespace and naming a random group."""
    def make(i: int) -> dict[str, Any]:
        namespace = f"tenant-{rng.randrange(quotas):04d}" if quotas else "default"
        pod = pod_json(f"bench-{i}", rng.choice(SHAPES), namespace=namespace)
        if groups:
            pod["metadata"]["labels"] = {"gpupool.io/group": f"group-{rng.randrange(groups):03d}"}
        return pod
    return make


def plain_pods(rng: random.Random) -> PodMaker:
    """The benchmark's usual pods: random shapes, no group, no quota."""
    return lambda i: pod_json(f"bench-{i}", rng.choice(SHAPES))
