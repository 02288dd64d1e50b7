"""One of the extender's cards as a DRA device selector sees it: the attributes and capacities the
node agent's ResourceSlice publishes for it (gpupool/nodeagent/dra/resource_slice.py), computed
from the card the ledger holds, so that the extender evaluates a claim's selectors on the values
kube-scheduler's allocator evaluates them on (a test pins the two to each other)."""

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


def card_device(card: GpuCard, driver: str) -> Device:
    """``card`` as a device of ``driver``: memory in bytes rounded down to gpupool's memory unit,
    compute in percent of a card, the profile and parent only on a virtual (MIG) card."""
    attributes: dict[str, str | int | bool] = {ATTR_MODEL: card.model, ATTR_UUID: card.uuid,
                                                ATTR_INDEX: card.index, ATTR_KIND: card.kind.value}
    if card.profile:
        attributes[ATTR_PROFILE] = card.profile
    if card.parent:
        attributes[ATTR_PARENT] = card.parent
    memory_mib = card.memory_mib // MEMORY_UNIT_MIB * MEMORY_UNIT_MIB
    capacity = {MEMORY: Decimal(memory_mib * MIB), COMPUTE: Decimal(card.compute * COMPUTE_PERCENT // COMPUTE_PER_CARD)}
    return Device(driver, {driver: attributes}, {driver: capacity})
