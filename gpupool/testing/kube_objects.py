"""Builders of Kubernetes JSON objects (plain dicts, as the API sends them) for the tests and the
benchmarks: nodes with an inventory, pods with gpupool's limits, pods an earlier bind placed."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpupool.api.annotations import Assignment, CardRef, ContainerCards, Inventory, encode_assignment, encode_inventory
from gpupool.core.model import GpuCard, Topology

GIB = 1024 * 1024 * 1024
HAMI_MIB = "nvidia.com/gpumem"


def node(
    name: str,
    card_mib: list[int] | None = None,
    *,
    model: str = "Tesla-V100",
    topology: Topology | None = None,
    annotations: dict[str, str] | None = None,
    capacity: dict[str, str] | None = None,
    serves: tuple[str, ...] = (HAMI_MIB,),
) -> dict[str, Any]:
    """A node; with ``card_mib`` it publishes an ``inventory-v1`` annotation with those cards.

    ``serves``: foreign aliases its kubelet advertises (the extender sends a pod that uses an alias
    only to nodes that advertise it). By default HAMi's MiB alias, which these tests use to ask
    exact MiB (the Alibaba example's cards are not multiples of 256 MiB)."""
    notes = dict(annotations or {})
    if card_mib is not None:
        cards = tuple(
            GpuCard(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=m)
            for i, m in enumerate(card_mib)
        )
        notes["gpupool.io/inventory-v1"] = encode_inventory(Inventory(cards, topology))
    caps = {"cpu": "32", "memory": "128Gi", "pods": "110", **dict.fromkeys(serves, "1"), **(capacity or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": notes, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": caps, "allocatable": dict(caps)},
    }


def container(name: str = "main", **limits: str | int) -> dict[str, Any]:
    """A container whose limits are given as keyword arguments.

    ``gpu_mem=16`` → ``gpupool.io/gpu-mem`` (256 MiB units); ``mib=8138`` → ``nvidia.com/gpumem``
    (MiB per card), for tests whose card sizes are not multiples of 256 MiB (the Alibaba example).
    """
    names = {"gpu": "gpupool.io/gpu", "gpu_mem": "gpupool.io/gpu-mem", "gpu_core": "gpupool.io/gpu-core",
             "mib": "nvidia.com/gpumem"}
    resolved = {names.get(k, k.replace("__", "/").replace("_", "-")): str(v) for k, v in limits.items()}
    return {"name": name, "image": "busybox", "resources": {"limits": resolved}}


def pod(
    name: str,
    *containers: dict[str, Any],
    namespace: str = "default",
    uid: str | None = None,
    annotations: dict[str, str] | None = None,
    node_name: str = "",
    init: list[dict[str, Any]] | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    """A pod with the given containers (default: one container asking 1000 MiB)."""
    spec: dict[str, Any] = {"containers": list(containers) or [container(mib=1000)]}
    if init:
        spec["initContainers"] = init
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",
            "annotations": dict(annotations or {}),
            "resourceVersion": "1",
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def placed_pod(
    name: str, node_name: str, card: int, mib: int, *, bound: bool = True, when: float | None = None
) -> dict[str, Any]:
    """A pod already holding ``mib`` on card ``card`` of ``node_name`` (as an earlier bind left it)."""

    stamp = dt.datetime.fromtimestamp(when, dt.UTC) if when is not None else dt.datetime.now(dt.UTC)
    a = Assignment(
        node_name, stamp, (ContainerCards("main", (CardRef(card, f"GPU-{node_name}-{card}", mib, 0),)),)
    )
    return pod(
        name,
        container(mib=mib),
        node_name=node_name if bound else "",
        annotations={"gpupool.io/assignment-v1": encode_assignment(a)},
    )
