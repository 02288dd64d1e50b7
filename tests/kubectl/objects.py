"""Hand-made API objects (the JSON dicts the apiserver returns) for the plugin's tests."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpupool.api.annotations import (
    Allocated,
    Assignment,
    CardRef,
    ContainerCards,
    Inventory,
    encode_allocated,
    encode_assignment,
    encode_inventory,
)
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard

NAMES = ResourceNames()
MODEL = "Tesla-T4"
NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def gpu_node(name: str, card_mib: list[int], *, cpu: str = "16", healthy: bool = True,
             listed: tuple[str, ...] = ()) -> dict[str, Any]:
    """A node whose agent published ``inventory-v1`` with cards of ``card_mib``."""
    cards = tuple(GpuCard(i, f"GPU-{name}-{i}", MODEL, mib, healthy=healthy) for i, mib in enumerate(card_mib))
    resources = {"cpu": cpu, "memory": "64Gi", "pods": "110", **dict.fromkeys(listed, "100")}
    return {"metadata": {"name": name, "annotations": {NAMES.inventory: encode_inventory(Inventory(cards))}},
            "status": {"capacity": resources, "allocatable": resources}}


def gpu_pod(name: str, mem_units: int | None = None, *, namespace: str = "team", cpu: str = "1",
            node: str = "", annotations: dict[str, str] | None = None, phase: str = "Pending",
            limits: dict[str, str] | None = None, container: str = "main") -> dict[str, Any]:
    """A pod asking ``mem_units`` × 256 MiB of one card (none: no GPU)."""
    wanted = dict(limits or {})
    if mem_units is not None:
        wanted[NAMES.gpu_mem] = str(mem_units)
    spec: dict[str, Any] = {"containers": [{"name": container, "resources": {"limits": wanted,
                                                                            "requests": {"cpu": cpu}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "annotations": dict(annotations or {})},
            "spec": spec, "status": {"phase": phase}}


def assignment(node: str, card: int, mib: int, *, compute: int = 0, exclusive: bool = False,
               container: str = "main", when: dt.datetime = NOW) -> dict[str, str]:
    """The ``assignment-v1`` annotation of one container holding a slice of one card."""
    ref = CardRef(index=card, uuid=f"GPU-{node}-{card}", memory_mib=mib, compute=compute, exclusive=exclusive)
    value = encode_assignment(Assignment(node=node, time=when, containers=(ContainerCards(container, (ref,)),)))
    return {NAMES.assignment: value}


def allocated(node: str) -> dict[str, str]:
    """The node agent's ``allocated-v1`` confirmation for ``node``."""
    return {NAMES.allocated: encode_allocated(Allocated(node=node, time=NOW))}


def placed(name: str, node: str, card: int, units: int, *, container: str = "main", **kwargs: Any) -> dict[str, Any]:
    """A running pod bound to ``node`` whose ``container`` holds ``units`` × 256 MiB of card ``card``."""
    return gpu_pod(name, units, node=node, phase="Running", container=container,
                   annotations=assignment(node, card, units * 256, container=container), **kwargs)


def dra_claim(name: str, node: str, *, card: int = 0, memory: str | None = None, compute: str | None = None,
              namespace: str = "team", driver: str = "gpu.gpupool.io",
              reserved_for: tuple[str, ...] = ()) -> dict[str, Any]:
    """A ResourceClaim allocated on ``node``'s card ``card`` (its pool is the node), consuming
    ``memory`` and ``compute`` (none: the whole card), reserved for the pods named (``uid-<name>``)."""
    consumed = {k: v for k, v in (("memory", memory), ("compute", compute)) if v is not None}
    result: dict[str, Any] = {"request": "gpu", "driver": driver, "pool": node, "device": f"gpu-{card}",
                              **({"consumedCapacity": consumed} if consumed else {})}
    status: dict[str, Any] = {"allocation": {"devices": {"results": [result]}}}
    if reserved_for:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"} for pod in reserved_for]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"}, "status": status}


def claim_pod(name: str, node: str, uses: dict[str, list[str]], *, claim: str = "", template: str = "",
              namespace: str = "team") -> dict[str, Any]:
    """A running pod on ``node`` with one ``resourceClaims`` entry ``gpu``: the ResourceClaim ``claim``,
    or one made from a template and named ``template`` in its status; ``uses``: each container's
    ``resources.claims`` entries."""
    entry = {"name": "gpu", "resourceClaimName": claim} if claim else {"name": "gpu",
                                                                       "resourceClaimTemplateName": "gpu-template"}
    containers = [{"name": c, "resources": {"claims": [{"name": e} for e in used]}} for c, used in uses.items()]
    status: dict[str, Any] = {"phase": "Running"}
    if template:
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": template}]
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "annotations": {}},
            "spec": {"nodeName": node, "resourceClaims": [entry], "containers": containers}, "status": status}
