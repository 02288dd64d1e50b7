"""Placement policies behind one interface; :func:`make_policy` builds one by name."""

from __future__ import annotations

import numpy as np

from gpupool.core.policies.base import PlacementPolicy, PodShape
from gpupool.core.policies.baseline import (
    BestFitPolicy,
    BinpackPolicy,
    ClusteringPolicy,
    DotProductPolicy,
    PackingPolicy,
    RandomPolicy,
    SpreadPolicy,
)
from gpupool.core.policies.dra_allocator import DraAllocatorPolicy, DraSteeredPolicy
from gpupool.core.policies.fgd import FgdPolicy
from gpupool.core.policies.gpupool_policy import GpupoolPolicy
from gpupool.core.policies.per_pod import PerPodPolicy

POLICIES: dict[str, type[PlacementPolicy]] = {
    cls.name: cls
    for cls in (RandomPolicy, BinpackPolicy, SpreadPolicy, BestFitPolicy, DotProductPolicy, PackingPolicy,
                ClusteringPolicy, FgdPolicy, GpupoolPolicy, DraAllocatorPolicy, DraSteeredPolicy)
}
DEFAULT_POLICY = GpupoolPolicy.name


def make_policy(name: str, rng: np.random.Generator | None = None) -> PlacementPolicy:
    """A fresh policy object by name; raises ``ValueError`` naming the choices for an unknown one."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(sorted(POLICIES))}") from None
    return cls(rng)


__all__ = ["DEFAULT_POLICY", "POLICIES", "PerPodPolicy", "PlacementPolicy", "PodShape", "make_policy"]
