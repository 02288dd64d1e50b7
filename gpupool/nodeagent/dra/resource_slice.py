"""The ResourceSlice of one node: each card one device with its capacity, attributes and request
policies, as the DRA allocator in kube-scheduler reads them (resource.k8s.io/v1).

Why these shapes:

* ``allowMultipleAllocations`` with a ``requestPolicy`` on both capacities (consumable capacity,
  KEP-5075, beta and on by default since 1.36) lets several claims share a card, each consuming
  what it asked for, so the scheduler never puts more on a card than it has;
* memory in bytes in steps of gpupool's memory unit (256 MiB, what the extender books), the card's
  capacity rounded down to that step; a claim naming no memory takes the whole card's memory, so a
  plain "one GPU" claim gets a whole card;
* compute in percent of the card in steps of 1; a claim naming none consumes 0 and runs without a
  compute limit, gpupool's meaning of a memory-only share (docs/dra.md); a MIG device offers its
  share of its card (its compute slices), and says it is ``virtual`` with its profile and parent.
"""

from __future__ import annotations

from typing import Any

from gpupool.api.dra import (
    ATTR_INDEX,
    ATTR_KIND,
    ATTR_MODEL,
    ATTR_PARENT,
    ATTR_PCI_BUS_ID,
    ATTR_PROFILE,
    ATTR_UUID,
    COMPUTE,
    MEMORY,
    device_name,
)
from gpupool.core.units import MEMORY_UNIT_MIB
from gpupool.kube.card_device import compute_capacity, memory_capacity_mib
from gpupool.nodeagent.gpu_inventory import GpuInventory


def slice_name(node: str, driver: str) -> str:
    """One slice per node and driver; the name is stable so an update replaces the old one."""
    return f"{node}-{driver}".lower()[:253]


def pci_bus_id(nvml: str) -> str:
    """NVML's ``00000000:3B:00.0`` as Kubernetes' standard attribute writes it, ``0000:3b:00.0``;
    ``""`` when NVML gave none or something else."""
    parts = nvml.lower().split(":")
    if len(parts) != 3 or not parts[0]:
        return ""
    return f"{parts[0][-4:]:0>4}:{parts[1]}:{parts[2]}"


def device_entry(inventory: GpuInventory, index: int) -> dict[str, Any]:
    """One card as a ResourceSlice device."""
    card = inventory.card(index)
    memory = memory_capacity_mib(card.memory_mib)
    attributes: dict[str, Any] = {ATTR_MODEL: {"string": card.model}, ATTR_UUID: {"string": card.uuid},
                                  ATTR_INDEX: {"int": card.index}, ATTR_KIND: {"string": card.kind.value}}
    if card.profile:
        attributes[ATTR_PROFILE] = {"string": card.profile}
    if card.parent:
        attributes[ATTR_PARENT] = {"string": card.parent}
    bus = pci_bus_id(inventory.pci_bus_id(index))
    if bus:
        attributes[ATTR_PCI_BUS_ID] = {"string": bus}
    compute = compute_capacity(card.compute)
    return {
        "name": device_name(index),
        "allowMultipleAllocations": True,
        "attributes": attributes,
        "capacity": {
            MEMORY: {"value": f"{memory}Mi", "requestPolicy": {
                "default": f"{memory}Mi",
                "validRange": {"min": f"{MEMORY_UNIT_MIB}Mi", "step": f"{MEMORY_UNIT_MIB}Mi"}}},
            COMPUTE: {"value": str(compute), "requestPolicy": {
                "default": "0", "validRange": {"min": "0", "max": str(compute), "step": "1"}}},
        },
    }


def resource_slice(node: str, driver: str, inventory: GpuInventory, generation: int) -> dict[str, Any]:
    """The whole slice of ``node``: every healthy card that can hold one memory unit (an unhealthy
    card is left out, so the allocator places nothing new on it)."""
    devices = [device_entry(inventory, c.index) for c in inventory.cards
               if c.healthy and memory_capacity_mib(c.memory_mib) > 0]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, driver)},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices},
    }
