"""HAMi's and Alibaba gpushare's resource names, read as those projects mean them.

HAMi (per container; limits, else requests):

* ``nvidia.com/gpu: n``: n cards. Alone it is n whole cards: HAMi's defaults then give each task all
  of a card's memory, which nobody can share.
* ``nvidia.com/gpumem: m``: m MiB on each card; ``nvidia.com/gpumem-percentage: p``: p % of each
  card's memory; both given: gpumem, as HAMi does; neither: the whole card's memory (HAMi's
  ``defaultMemory: 0``), so ``gpucores`` alone still keeps others off the card, as under HAMi.
* ``nvidia.com/gpucores: c``: c % of each card's compute (HAMi's ``defaultCores: 0``: none);
  ``100`` is the whole card, exclusive.
* ``nvidia.com/priority``: 0 or 1, HAMi's time-slicing priority inside the card (not the pod's
  scheduling priority, which stays ``spec.priority``). Checked here; it books nothing, and becomes
  the pod's priority at open time and for borrowing (:func:`gpupool.api.lending.hami_task_priority`).
* Without ``nvidia.com/gpu``: one card, which is what HAMi's admission webhook writes
  (``defaultGPUNum: 1``). gpupool has no mutating webhook, and kubelet calls the device plugin only
  for the card count (the other names are never kubelet devices), so such a container would start
  without its grant: the extender's filter refuses it on every node with that reason
  (``UNSERVABLE`` in :mod:`gpupool.api.names`, via ``foreign_resources``).
* A memory slice below :data:`SMALLEST_SLICE_MIB` beside ``nvidia.com/gpu`` is refused: each slice
  is one ``nvidia.com/gpu`` kubelet device, and a card offers ``memory // 256 + 200`` of them
  (docs/node-agent.md).

gpushare: ``aliyun.com/gpu-mem`` is memory in GiB (or MiB: ``ResourceNames.gpushare_unit_mib``),
on one card; with the pod label ``aliyun.com/gpu-count: M`` (Alibaba cGPU) the value is the
container's total, split evenly over M cards, and must divide by M.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gpupool.api import names as n
from gpupool.api.limits import MAX_CARD_MEMORY_MIB, MAX_CARDS_PER_NODE
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuKind, GpuRequest
from gpupool.core.units import COMPUTE_PER_CARD, MEMORY_UNIT_MIB

SMALLEST_SLICE_MIB = MEMORY_UNIT_MIB
"""Least memory a HAMi slice may ask for (see the module doc)."""

PERCENT = 100
HAMI_DEFAULT_CARDS = 1
"""HAMi's ``defaultGPUNum``: the card count its webhook gives a container that names none."""
HAMI_PRIORITIES = (0, 1)


class ForeignRequestError(ValueError):
    """A foreign resource combination gpupool cannot run as its project meant it; says why."""


def is_hami(found: Mapping[str, int]) -> bool:
    """Whether a container's resources are HAMi's (any HAMi name but a bare ``nvidia.com/gpu``,
    which is HAMi's only where the deployment says so: then it is in ``found`` at all)."""
    return any(name in n.HAMI_NAMES for name in found)


def _percent(found: Mapping[str, int], name: str, where: str, low: int) -> int | None:
    value = found.get(name)
    if value is not None and not low <= value <= PERCENT:
        raise ForeignRequestError(f"{where}: {name} is a percentage of one card ({low}..{PERCENT}), got {value}")
    return value


def hami_request(found: Mapping[str, int], where: str, *, exclusive: bool = False,
                 models: frozenset[str] = frozenset(), kind: GpuKind | None = None) -> GpuRequest:
    """The per-card request of a container asking only for HAMi's names (see the module doc)."""
    others = sorted(name for name in found if name not in n.HAMI_NAMES)
    if others:
        raise ForeignRequestError(f"{where}: HAMi's names cannot be combined with {', '.join(others)}; "
                                  "use one project's names per container")
    priority = found.get(n.NVIDIA_PRIORITY, 0)
    if priority not in HAMI_PRIORITIES:
        raise ForeignRequestError(f"{where}: {n.NVIDIA_PRIORITY} is 0 (high) or 1 (low), got {priority}")
    count = found.get(n.NVIDIA_GPU, HAMI_DEFAULT_CARDS)
    if count > MAX_CARDS_PER_NODE:
        raise ForeignRequestError(f"{where}: {n.NVIDIA_GPU}={count} exceeds gpupool's bound for one node "
                                  f"(at most {MAX_CARDS_PER_NODE})")
    memory = found.get(n.NVIDIA_GPUMEM)
    share = _percent(found, n.NVIDIA_GPUMEM_PERCENTAGE, where, 1)
    cores = _percent(found, n.NVIDIA_GPUCORES, where, 0) or 0
    smallest = SMALLEST_SLICE_MIB if n.NVIDIA_GPU in found else 1  # without it no kubelet device counts
    if memory is not None and not smallest <= memory <= MAX_CARD_MEMORY_MIB:
        raise ForeignRequestError(f"{where}: {n.NVIDIA_GPUMEM}={memory} MiB is outside "
                                  f"{smallest}..{MAX_CARD_MEMORY_MIB} MiB per card")
    sliced = memory is not None or share is not None or cores
    if exclusive or cores == PERCENT or not sliced:
        return replace(GpuRequest.whole(count, models), kind=kind)
    if memory is not None:
        return GpuRequest(count=count, compute=cores * (COMPUTE_PER_CARD // PERCENT), memory_mib=memory,
                          models=models, kind=kind)
    per_mille = (share or PERCENT) * (COMPUTE_PER_CARD // PERCENT)
    return GpuRequest(count=count, compute=cores * (COMPUTE_PER_CARD // PERCENT), memory_mib=0,
                      memory_share=per_mille, models=models, kind=kind)


def gpushare_per_card(found: Mapping[str, int], names: ResourceNames, cards: int | None,
                      where: str) -> dict[str, int]:
    """``found`` with gpushare's total over ``cards`` cards turned into gpupool's reading: the memory
    per card under ``aliyun.com/gpu-mem`` and the card count under ``<domain>/gpu-shared``."""
    total = found.get(n.ALIYUN_GPU_MEM)
    if total is None or cards is None:
        return dict(found)
    if total % cards:
        raise ForeignRequestError(f"{where}: {n.ALIYUN_GPU_MEM}={total} cannot be split evenly over "
                                  f"{cards} cards (label {n.ALIYUN_GPU_COUNT}); give a multiple of {cards}")
    shared = found.get(names.gpu_shared)
    if shared is not None and shared != cards:
        raise ForeignRequestError(f"{where}: label {n.ALIYUN_GPU_COUNT}={cards} but {names.gpu_shared}={shared}")
    out = dict(found)
    out[n.ALIYUN_GPU_MEM] = total // cards
    if cards > 1:
        out[names.gpu_shared] = cards
    return out
