"""Node capacity other systems' schedulers read, published where this agent serves their names.

Why: Alibaba gpushare's device plugin also wrote the node's card count as the extended resource
``aliyun.com/gpu-count`` in ``status.capacity`` (its scheduler extender and cGPU tooling read it, and
so do dashboards built on it). A node migrated to gpupool that serves ``aliyun.com/gpu-mem`` keeps
publishing it, so those readers keep working. It is a status capacity, as gpushare wrote it (never
a device plugin resource: no pod asks for it, so kubelet is never asked to allocate it); kubelet
keeps extended resources written to the status that no device plugin owns and copies them into
``allocatable`` on its next status update, and the agent writes both at once.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.api import names as n


def foreign_capacity(served: Iterable[str], cards: int) -> dict[str, str]:
    """The extended resources to write into the node's ``status.capacity`` and ``allocatable`` for
    the foreign names in ``served`` on a node of ``cards`` cards (empty when none needs any)."""
    if n.ALIYUN_GPU_MEM not in set(served):
        return {}
    return {n.ALIYUN_GPU_COUNT: str(cards)}


def capacity_patch(capacity: dict[str, str]) -> dict[str, object]:
    """The merge patch of the node's status that publishes ``capacity``."""
    return {"status": {"capacity": dict(capacity), "allocatable": dict(capacity)}}
