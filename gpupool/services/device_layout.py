"""The kubelet devices gpupool advertises: short IDs that name their card, per resource.

IDs are ``g<i>`` (whole card), ``g<i>-m<k>`` (256 MiB of card i) and ``g<i>-c<k>`` (1 % of card i).
Naming the card lets GetPreferredAllocation steer kubelet onto the assigned cards and lets logs and
reconciliation read which card a device ID stands for; identity of the *pod* never comes from them
(see docs/allocate-mapping.md). Short IDs keep ListAndWatch for 8 x 141 GB cards near 90 kB.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.core.names import ResourceNames
from gpupool.services.gpu_inventory import GpuInventory
from gpupool.services.node_types import CORE_PER_CARD, MEMORY_UNIT


class DeviceLayout:
    """Device IDs of every resource, derived from the inventory."""

    def __init__(self, names: ResourceNames) -> None:
        self.names = names

    def devices(self, resource: str, inventory: GpuInventory) -> list[tuple[str, bool]]:
        """(ID, healthy) of every device of ``resource``; unhealthy cards' devices say so."""
        out: list[tuple[str, bool]] = []
        for card in inventory.cards:
            for device_id in self.card_ids(resource, card.index, card.memory_mib):
                out.append((device_id, card.healthy))
        return out

    def card_ids(self, resource: str, index: int, memory_mib: int) -> list[str]:
        """IDs of one card for one resource."""
        if resource == self.names.gpu:
            return [f"g{index}"]
        if resource == self.names.gpu_mem:
            return [f"g{index}-m{k}" for k in range(memory_mib // MEMORY_UNIT)]
        if resource == self.names.gpu_core:
            return [f"g{index}-c{k}" for k in range(CORE_PER_CARD)]
        raise KeyError(f"gpupool does not advertise {resource}")

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
