"""The kubelet devices gpupool advertises: short IDs that name their card, per resource.

IDs are ``g<i>`` (whole card), ``g<i>-m<k>`` (256 MiB of card i), ``g<i>-G<k>`` (1 GiB of card i,
gpushare's unit), ``g<i>-c<k>`` (1 % of card i) and ``g<i>-s<k>`` (one slice on card i).
Naming the card lets GetPreferredAllocation steer kubelet onto the assigned cards and lets logs and
reconciliation read which card a device ID stands for; identity of the *pod* never comes from them
(see docs/allocate-mapping.md). Short IDs keep ListAndWatch for 8 x 141 GB cards near 90 kB.

The rule behind every count: kubelet admits a container only when the node has as many free
devices of each resource as its limit, so each resource's devices per card are exactly what the
extender can book of that card in the resource's unit (whole cards, memory units, percent), and
never fewer; ``gpu-shared`` counts slices, which the extender does not cap, so a card offers more
slice devices than it can ever hold slices (each slice takes at least one memory unit or 1 %).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpupool.api import names as n
from gpupool.api.names import ResourceNames
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.types import CORE_PER_CARD, MEMORY_UNIT


@dataclass(frozen=True)
class DeviceUnit:
    """What one kubelet device of a resource stands for: ``tag`` in its ID (``g<i>-<tag><k>``; empty
    for the whole card ``g<i>``) and how many devices one card offers."""

    tag: str
    memory_mib: int = 0
    """One device is this much card memory (0: not a memory resource)."""
    fixed: int = 0
    """Devices per card whatever its memory (whole card: 1, percent: 100)."""
    slices: bool = False
    """One device is one slice: more per card than a card can hold slices."""

    def count(self, card_memory_mib: int) -> int:
        """Devices of this resource on one card."""
        if self.slices:
            return card_memory_mib // MEMORY_UNIT + CORE_PER_CARD
        if self.memory_mib:
            return card_memory_mib // self.memory_mib
        return self.fixed


def device_units(names: ResourceNames) -> dict[str, DeviceUnit]:
    """Every resource the node agent can serve: gpupool's own and the servable foreign aliases."""
    return {
        names.gpu: DeviceUnit("", fixed=1),
        names.gpu_mem: DeviceUnit("m", memory_mib=MEMORY_UNIT),
        names.gpu_core: DeviceUnit("c", fixed=CORE_PER_CARD),
        names.gpu_shared: DeviceUnit("s", slices=True),
        n.ALIYUN_GPU_MEM: DeviceUnit("G", memory_mib=1024),
        n.TENCENT_VCUDA_MEMORY: DeviceUnit("m", memory_mib=MEMORY_UNIT),
        n.TENCENT_VCUDA_CORE: DeviceUnit("c", fixed=CORE_PER_CARD),
    }


class DeviceLayout:
    """Device IDs of every resource, derived from the inventory."""

    def __init__(self, names: ResourceNames) -> None:
        self.names = names
        self.units = device_units(names)

    def devices(self, resource: str, inventory: GpuInventory) -> list[tuple[str, bool]]:
        """(ID, healthy) of every device of ``resource``; unhealthy cards' devices say so."""
        out: list[tuple[str, bool]] = []
        for card in inventory.cards:
            for device_id in self.card_ids(resource, card.index, card.memory_mib):
                out.append((device_id, card.healthy))
        return out

    def card_ids(self, resource: str, index: int, memory_mib: int) -> list[str]:
        """IDs of one card for one resource."""
        unit = self.units.get(resource)
        if unit is None:
            raise KeyError(f"gpupool does not advertise {resource}")
        if not unit.tag:
            return [f"g{index}"]
        return [f"g{index}-{unit.tag}{k}" for k in range(unit.count(memory_mib))]

    @staticmethod
    def card_of(device_id: str) -> int | None:
        """The card index a device ID stands for; ``None`` for a foreign ID."""
        if device_id[:1] != "g":
            return None
        dash = device_id.find("-")
        head = device_id[1:dash] if dash > 0 else device_id[1:]
        return int(head) if head.isdigit() else None

    def prefer(self, available: Iterable[str], must_include: Iterable[str], size: int,
               cards: list[int]) -> list[str]:
        """``size`` IDs: ``must_include`` first, then available ones on ``cards`` round-robin,
        then any available (lowest first) if the assigned cards lack enough free IDs.

        One pass over ``available`` (thousands of memory IDs) and sorting only the few buckets
        needed: kubelet waits for this answer while holding its device-manager lock.
        """
        chosen = list(dict.fromkeys(must_include))[:size]
        if len(chosen) >= size:
            return chosen
        taken = set(chosen)
        wanted = set(cards)
        by_card: dict[int, list[str]] = {c: [] for c in cards}
        rest: list[str] = []
        for device_id in available:
            if device_id in taken:
                continue
            card = self.card_of(device_id)
            if card is not None and card in wanted:
                by_card[card].append(device_id)
            else:
                rest.append(device_id)
        queues = [sorted(q, key=_id_key) for q in by_card.values() if q]
        position = 0
        while len(chosen) < size and queues:
            queue = queues[position % len(queues)]
            chosen.append(queue.pop(0))
            if not queue:
                queues.remove(queue)
            else:
                position += 1
        if len(chosen) < size:
            chosen.extend(sorted(rest, key=_id_key)[: size - len(chosen)])
        return chosen


def _id_key(device_id: str) -> tuple[int, int, str]:
    card = DeviceLayout.card_of(device_id)
    tail = device_id.rsplit("-", 1)[-1][1:] if "-" in device_id else "0"
    return (card if card is not None else 1 << 30, int(tail) if tail.isdigit() else 0, device_id)
