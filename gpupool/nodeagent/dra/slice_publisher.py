"""Keeps this node's ResourceSlice equal to its cards: written at start and after every change of
the inventory (health, cordon), never rewritten when nothing changed, and read back every
:data:`RESYNC_S` seconds (kubelet deletes a driver's slices some time after its plugin went away,
and someone may edit or delete the slice: what is missing or different is written again).

The pool's generation goes up with every rewrite: the allocator uses only the slices of a pool's
newest generation, so it never mixes an old view of the cards with a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from gpupool.nodeagent.dra.resource_slice import resource_slice, slice_name
from gpupool.nodeagent.gpu_inventory import GpuInventory

log = logging.getLogger(__name__)

RETRY_S = 5.0
#: What an apiserver drops when ``DRAConsumableCapacity`` is off.
SHARING_FIELDS = ("allowMultipleAllocations", "requestPolicy")
RESYNC_S = 60.0


class SliceStore(Protocol):
    """Where slices are kept (the API; tests: a dict)."""

    async def read_slice(self, name: str) -> Mapping[str, Any] | None: ...

    async def write_slice(self, body: Mapping[str, Any], resource_version: str | None) -> None: ...


class SlicePublisher:
    """Publishes ``node``'s slice for ``driver`` from ``inventory()``."""

    def __init__(self, node: str, driver: str, store: SliceStore, inventory: Callable[[], GpuInventory]) -> None:
        self.node = node
        self.driver = driver
        self.store = store
        self.inventory = inventory
        self.writes = 0
        self.consumable_capacity: bool | None = None
        """Whether the API kept the fields that let claims share a card (``None`` until read back):
        an apiserver without ``DRAConsumableCapacity`` (off before 1.36) drops them silently."""

    async def publish(self) -> bool:
        """Write the slice if it differs from what the API has; whether it wrote."""
        name = slice_name(self.node, self.driver)
        current = await self.store.read_slice(name)
        generation = 1
        version = None
        if current is not None:
            spec = current.get("spec") or {}
            generation = int((spec.get("pool") or {}).get("generation", 0)) + 1
            version = str((current.get("metadata") or {}).get("resourceVersion", ""))
            wanted = resource_slice(self.node, self.driver, self.inventory(), generation - 1)["spec"]
            if _same(spec, wanted):
                self._kept(True)
                return False
            if _same(spec, _without_sharing(wanted)):
                self._kept(False)
                return False
        body = resource_slice(self.node, self.driver, self.inventory(), generation)
        await self.store.write_slice(body, version)
        self.writes += 1
        log.info("published ResourceSlice %s (generation %d, %d devices)", name, generation,
                 len(body["spec"]["devices"]))
        return True

    def _kept(self, consumable: bool) -> None:
        if consumable != self.consumable_capacity and not consumable:
            log.warning("the apiserver dropped allowMultipleAllocations and requestPolicy from the ResourceSlice: "
                        "DRAConsumableCapacity is off (Kubernetes before 1.36 by default), so each claim gets a "
                        "whole card and no two claims share one (docs/dra.md)")
        self.consumable_capacity = consumable

    async def run(self, changed: Callable[[int], Awaitable[int]], version: int) -> None:
        """Publish now, after every inventory change (``changed(seen)`` returns the next version)
        and every :data:`RESYNC_S` seconds, retrying failed writes, until cancelled."""
        while True:
            try:
                await self.publish()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API may be away; try again
                log.error("publishing the ResourceSlice failed: %s; retrying in %g s", exc, RETRY_S)
                await asyncio.sleep(RETRY_S)
                continue
            with contextlib.suppress(TimeoutError):  # nothing changed here: check the API still has it
                async with asyncio.timeout(RESYNC_S):  # not wait_for: it can swallow a cancellation (3.11)
                    version = await changed(version)


def _without_sharing(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` as an apiserver without ``DRAConsumableCapacity`` stores it."""
    devices = [{**{k: v for k, v in d.items() if k not in SHARING_FIELDS},
                "capacity": {n: {k: v for k, v in c.items() if k not in SHARING_FIELDS}
                             for n, c in d.get("capacity", {}).items()}} for d in spec.get("devices", [])]
    return {**spec, "devices": devices}


def _same(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether the API's spec says what ``wanted`` says, compared as written (a quantity the API
    wrote back in another form costs one needless rewrite, never a wrong slice)."""
    keys = ("driver", "nodeName", "pool", "devices")
    return all(current.get(k) == wanted.get(k) for k in keys)
