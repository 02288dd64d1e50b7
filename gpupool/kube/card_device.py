"""One of the extender's cards as a DRA device selector sees it: the attributes and capacities the
node agent's ResourceSlice publishes for it (gpupool/nodeagent/dra/resource_slice.py), computed
from the card the ledger holds, so that the extender evaluates a claim's selectors on the values
kube-scheduler's allocator evaluates them on (a test pins the two to each other). The capacities
are computed by the same two functions the slice uses (:func:`memory_capacity_mib`,
:func:`compute_capacity`)."""

from __future__ import annotations

from decimal import Decimal

from gpupool.api.dra import (
    ATTR_INDEX,
    ATTR_KIND,
    ATTR_MODEL,
    ATTR_PARENT,
    ATTR_PROFILE,
    ATTR_UUID,
    COMPUTE,
    COMPUTE_PERCENT,
    MEMORY,
    MIB,
)
from gpupool.core.model import GpuCard
from gpupool.core.units import COMPUTE_PER_CARD, MEMORY_UNIT_MIB
from gpupool.kube.device_selector import Device


def memory_capacity_mib(card_memory_mib: int) -> int:
    """What a card offers to claims: its memory rounded down to gpupool's memory unit."""
    return card_memory_mib // MEMORY_UNIT_MIB * MEMORY_UNIT_MIB


def compute_capacity(card_compute_milli: int) -> int:
    """What a card offers in percent of a whole card: 100, or a MIG device's share rounded down
    (42 for a 3g device of 7 slices), so the allocator never grants more than the node books."""
    return card_compute_milli * COMPUTE_PERCENT // COMPUTE_PER_CARD


def card_device(card: GpuCard, driver: str) -> Device:
    """``card`` as a device of ``driver``: memory in bytes rounded down to gpupool's memory unit,
    compute in percent of a card, the profile and parent only on a virtual (MIG) card."""
    attributes: dict[str, str | int | bool] = {ATTR_MODEL: card.model, ATTR_UUID: card.uuid,
                                                ATTR_INDEX: card.index, ATTR_KIND: card.kind.value}
    if card.profile:
        attributes[ATTR_PROFILE] = card.profile
    if card.parent:
        attributes[ATTR_PARENT] = card.parent
    capacity = {MEMORY: Decimal(memory_capacity_mib(card.memory_mib) * MIB),
                COMPUTE: Decimal(compute_capacity(card.compute))}
    return Device(driver, {driver: attributes}, {driver: capacity})
