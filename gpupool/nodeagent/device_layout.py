"""The kubelet devices gpupool advertises: short IDs that name their card, per resource.

IDs are ``g<i>`` (whole card), ``g<i>-m<k>`` (256 MiB of card i), ``g<i>-G<k>`` (1 GiB of card i,
gpushare's unit; ``g<i>-M<k>``: 1 MiB, its MiB mode), ``g<i>-c<k>`` (1 % of card i), ``g<i>-s<k>``
(one slice on card i) and ``g<i>-h<k>`` (one HAMi card of a container on card i: ``nvidia.com/gpu``).
Naming the card lets GetPreferredAllocation steer kubelet onto the assigned cards and lets logs and
reconciliation read which card a device ID stands for; identity of the *pod* never comes from them
(see docs/allocate-mapping.md). Short IDs keep ListAndWatch for 8 x 141 GB cards near 90 kB.

The rule behind every count: kubelet admits a container only when the node has as many free
devices of each resource as its limit, so each resource's devices per card are exactly what the
extender can book of that card in the resource's unit (whole cards, memory units, percent), and
never fewer; ``gpu-shared`` counts slices, which the extender does not cap, so a card offers more
slice devices than it can ever hold slices (each slice takes at least one memory unit or 1 %).
HAMi's ``nvidia.com/gpu`` counts the cards of each container, i.e. slices too: every HAMi slice
takes at least 256 MiB or 1 % of the card's memory (its memory share, floored), so a card of at
least 100 MiB holds at most ``memory // 256 + 200`` of them (``floor(m/100) >= m/200``).

A device is ~22 bytes of a ListAndWatch message, and kubelet reads at most 4 MiB per message
(gRPC's default): :func:`list_and_watch_problem` refuses a layout past that (gpushare's MiB mode
on a node with much GPU memory) at start, with the reason, instead of a plugin kubelet cannot read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpupool.api import names as n
from gpupool.api.names import ResourceNames
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.types import CORE_PER_CARD, MEMORY_UNIT

KUBELET_MESSAGE_BYTES = 4 * 1024 * 1024
"""The largest gRPC message kubelet's device plugin client receives (gRPC's default)."""
DEVICE_MESSAGE_BYTES = 6
"""Per device in a ListAndWatch message beyond its ID and health strings (tags and lengths)."""
HEALTH_BYTES = len("Unhealthy")


@dataclass(frozen=True)
class DeviceUnit:
    """What one kubelet device of a resource stands for: ``tag`` in its ID (``g<i>-<tag><k>``; empty
    for the whole card ``g<i>``) and how many devices one card offers: ``memory // memory_mib``
    (0 when ``memory_mib`` is 0) plus ``fixed``."""

    tag: str
    memory_mib: int = 0
    """Devices per this much card memory (0: none by memory)."""
    fixed: int = 0
    """Devices per card whatever its memory (whole card: 1, percent: 100, slices: 100 or 200 more)."""

    def count(self, card_memory_mib: int) -> int:
        """Devices of this resource on one card."""
        return (card_memory_mib // self.memory_mib if self.memory_mib else 0) + self.fixed


def device_units(names: ResourceNames) -> dict[str, DeviceUnit]:
    """Every resource the node agent can serve: gpupool's own and the servable foreign aliases."""
    gib = names.gpushare_unit_mib == n.GIB_MIB
    return {
        names.gpu: DeviceUnit("", fixed=1),
        names.gpu_mem: DeviceUnit("m", memory_mib=MEMORY_UNIT),
        names.gpu_core: DeviceUnit("c", fixed=CORE_PER_CARD),
        names.gpu_shared: DeviceUnit("s", memory_mib=MEMORY_UNIT, fixed=CORE_PER_CARD),
        n.ALIYUN_GPU_MEM: DeviceUnit("G" if gib else "M", memory_mib=names.gpushare_unit_mib),
        n.TENCENT_VCUDA_MEMORY: DeviceUnit("m", memory_mib=MEMORY_UNIT),
        n.TENCENT_VCUDA_CORE: DeviceUnit("c", fixed=CORE_PER_CARD),
        n.NVIDIA_GPU: DeviceUnit("h", memory_mib=MEMORY_UNIT, fixed=2 * CORE_PER_CARD),
    }


def list_and_watch_problem(layout: DeviceLayout, resource: str, inventory: GpuInventory) -> str | None:
    """Why kubelet could not read ``resource``'s device list for these cards, or None."""
    size = sum(len(device_id) + HEALTH_BYTES + DEVICE_MESSAGE_BYTES
               for card in inventory.cards
               for device_id in layout.card_ids(resource, card.index, card.memory_mib))
    if size <= KUBELET_MESSAGE_BYTES:
        return None
    return (f"{resource}: {size:,} bytes of devices per ListAndWatch, more than kubelet reads in one "
            f"message ({KUBELET_MESSAGE_BYTES:,}); this node's GPU memory is too large for that unit")


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
        needed: kubelet's admission of the pod waits for this answer.
        """
        chosen = list(dict.fromkeys(must_include))[:size]
        if len(chosen) >= size:
            return chosen
        taken = set(chosen)
        by_card: dict[int, list[str]] = {c: [] for c in cards}
        rest: list[str] = []
        # The card of an ID is read from its head (``g<i>``, before the dash), and a card has
        # hundreds of IDs: each head is parsed once, then looked up (card_of on every ID, and again
        # in every sort key, made this answer twice as slow: 1.1 ms against 0.55 ms for 2,048 IDs).
        buckets: dict[str, list[str]] = {}
        for device_id in available:
            if device_id in taken:
                continue
            dash = device_id.find("-")
            head = device_id[:dash] if dash > 0 else device_id
            bucket = buckets.get(head)
            if bucket is None:
                card = self.card_of(head)
                bucket = buckets[head] = by_card[card] if card is not None and card in by_card else rest
            bucket.append(device_id)
        queues = [sorted(q, key=_unit_key) for q in by_card.values() if q]  # one card each
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
    return (card if card is not None else 1 << 30, *_unit_key(device_id))


def _unit_key(device_id: str) -> tuple[int, str]:
    """The order of IDs of one card: by unit number (``g0-m2`` before ``g0-m10``)."""
    tail = device_id.rsplit("-", 1)[-1][1:] if "-" in device_id else "0"
    return (int(tail) if tail.isdigit() else 0, device_id)
