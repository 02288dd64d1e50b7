"""Which of the resources a pod asks for are GPUs: gpupool's, the names it reads, and other plugins'.

Why: a pod in an infrastructure namespace (``--infrastructure-namespaces``, docs/monitor.md
"Infrastructure pods") is exempt from the usage, lending and risk rules only when it asked for no
GPU at all. Booking none of gpupool's is not enough: a pod there that asked NVIDIA's device plugin for
``nvidia.com/gpu`` (the GPU Operator's validators do), or another vendor's plugin for a card, holds
that card as its tenant, and is judged as one (its hold makes the card used and keeps it from being
lent; the risk checks report it, ``ungranted-card``, when gpupool granted it nothing there).

A GPU resource is an extended resource (a name with a domain: ``cpu``, ``memory`` or
``hugepages-2Mi`` never are) that is
- one gpupool reads (:meth:`~gpupool.api.names.ResourceNames.readable`: its own under the configured
  domain, HAMi's, gpushare's and GPUManager's names whether this node serves them or not
  (``--serve-aliases``, ``--hami``), and ``nvidia.com/gpu``), or
- any resource of NVIDIA's domain (its device plugin's ``nvidia.com/gpu``, ``nvidia.com/gpu.shared``
  under time-slicing, ``nvidia.com/mig-1g.10gb`` and the other MIG profiles), or
- any other name with ``gpu`` in it (``amd.com/gpu``, ``gpu.intel.com/i915``, a vGPU plugin's).

Erring towards a GPU is the safe side: a pod wrongly taken for a GPU tenant is merely judged as one.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gpupool.api.names import ResourceNames

GPU_VENDOR_DOMAINS = frozenset({"nvidia.com"})
"""Domains whose every extended resource is a GPU or part of one, whatever its name (MIG profiles)."""

_CONTAINER_KEYS = ("initContainers", "containers")
"""Ephemeral containers cannot ask for resources."""


def is_gpu_resource(name: str, names: ResourceNames) -> bool:
    """Whether the resource ``name`` in a container's limits or requests is a GPU (module doc)."""
    return _is_gpu(name, _readable(names))


@functools.cache
def _readable(names: ResourceNames) -> frozenset[str]:
    """The names gpupool reads, once per setting (every pod event of the watch asks)."""
    return frozenset(names.readable())


def _is_gpu(name: str, readable: frozenset[str]) -> bool:
    if name in readable:
        return True
    domain, slash, _ = name.partition("/")
    return bool(slash) and (domain in GPU_VENDOR_DOMAINS or "gpu" in name.lower())


def gpu_resources_asked(spec: Any, names: ResourceNames) -> frozenset[str]:
    """The GPU resources any container of a pod's ``spec`` asks for (limits or requests, non-zero or
    not: asking is what counts); malformed parts are skipped."""
    if not isinstance(spec, Mapping):
        return frozenset()
    readable = _readable(names)
    found: set[str] = set()
    for key in _CONTAINER_KEYS:
        for container in spec.get(key) or ():
            resources = container.get("resources") if isinstance(container, Mapping) else None
            if not isinstance(resources, Mapping):
                continue
            for part in ("limits", "requests"):
                asked = resources.get(part)
                if isinstance(asked, Mapping):
                    found.update(str(n) for n in asked if _is_gpu(str(n), readable))
    return frozenset(found)
