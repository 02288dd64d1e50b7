"""Builders of tenancy objects and a small cache for the extender's tenancy tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpupool.core.model import PodRequest
from gpupool.extender.cache import ClusterCache
from gpupool.kube.tenancy import PodTenancy, pod_tenancy
from gpupool.kube.translate import pod_request
from tests.kube.builders import container, node, pod

CARD = 16_384


def group(name: str, nodes: dict[str, list[str] | None], *, shared: bool = False,
          subjects: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A ResourceGroup object: per node the GPU UUIDs of the group (None: all of them)."""
    entries = [{"name": n} if gpus is None else {"name": n, "gpus": gpus} for n, gpus in nodes.items()]
    spec: dict[str, Any] = {"shared": shared, "nodes": entries}
    if subjects is not None:
        spec["subjects"] = subjects
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "ResourceGroup", "metadata": {"name": name},
            "spec": spec}


def quota(namespace: str, name: str = "gpus", *, hard: dict[str, Any] | None = None,
          models: dict[str, Any] | None = None, pools: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"hard": hard or {}}
    if models is not None:
        spec["models"] = models
    if pools is not None:
        spec["pools"] = pools
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "GpuQuota",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def namespace(name: str, default_groups: str | None = None) -> dict[str, Any]:
    notes = {} if default_groups is None else {"gpupool.io/default-groups": default_groups}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "annotations": notes}}


def pool_node(name: str, cards: int, pool: str, model: str = "Tesla-V100") -> dict[str, Any]:
    found = node(name, [CARD] * cards, model=model)
    found["metadata"]["labels"]["gpupool.io/pool"] = pool
    return found


def world(nodes: Sequence[dict[str, Any]], groups: Sequence[dict[str, Any]] = (),
          quotas: Sequence[dict[str, Any]] = (), namespaces: Sequence[dict[str, Any]] = ()) -> ClusterCache:
    """A synced cache with these nodes and tenancy objects and no pods."""
    cache = ClusterCache(policy="binpack", tenancy_required=True)
    cache.replace_nodes(nodes)
    cache.replace_pods([])
    with cache.lock:
        cache.tenancy.replace_groups(groups)
        cache.tenancy.replace_quotas(quotas)
        cache.tenancy.replace_namespaces(namespaces)
    return cache


def gpu_pod(name: str, ns: str = "team-a", *, group_label: str | None = None, gpu_core: int = 0,
            gpu_mem: int | str = 0, whole: int = 0, annotations: dict[str, str] | None = None,
            service_account: str | None = None) -> dict[str, Any]:
    limits: dict[str, int | str] = {}
    if whole:
        limits["gpu"] = whole
    if gpu_core:
        limits["gpu_core"] = gpu_core
    if gpu_mem:
        limits["gpu_mem"] = gpu_mem
    found = pod(name, container(**limits), namespace=ns, annotations=annotations)
    if group_label is not None:
        found["metadata"]["labels"] = {"gpupool.io/group": group_label}
    if service_account is not None:
        found["spec"]["serviceAccountName"] = service_account
    return found


def read(cache: ClusterCache, raw: dict[str, Any]) -> tuple[PodRequest, PodTenancy]:
    return pod_request(raw, cache.names), pod_tenancy(raw, cache.tenancy.names)
