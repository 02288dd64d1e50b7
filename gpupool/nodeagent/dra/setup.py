"""Putting the DRA driver together for ``gpupool node-agent --dra``: the claim state, its server and
the slice publisher, run beside the device plugin."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpupool.nodeagent.dra.api import KUBELET_DIR, REGISTRY_SUBDIR, driver_name
from gpupool.nodeagent.dra.cdi import DEFAULT_CDI_DIR, CdiSpecs
from gpupool.nodeagent.dra.claim_state import ClaimReader, ClaimState, HeldElsewhere
from gpupool.nodeagent.dra.server import DraPluginServer
from gpupool.nodeagent.dra.slice_publisher import SlicePublisher, SliceStore
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.isolation.backends import Enforcement

CHECKPOINT_FILE = "prepared-claims.json"


@dataclass(frozen=True)
class DraOptions:
    """Where the driver's files go. ``kubelet_dir`` is kubelet's root directory as this process
    sees it (the registration socket goes in its ``plugins_registry``); ``checkpoint`` defaults to
    ``<kubelet_dir>/plugins/<driver>/prepared-claims.json``."""

    kubelet_dir: str = KUBELET_DIR
    cdi_dir: str = DEFAULT_CDI_DIR
    checkpoint: str | None = None

    def socket_path(self, driver: str) -> str:
        return os.path.join(self.kubelet_dir, REGISTRY_SUBDIR, f"{driver}-reg.sock")

    def checkpoint_path(self, driver: str) -> str:
        return self.checkpoint or os.path.join(self.kubelet_dir, "plugins", driver, CHECKPOINT_FILE)


class DraDriver:
    """The DRA driver of one node; :meth:`run` serves kubelet and keeps the slice until cancelled."""

    def __init__(self, node: str, domain: str, options: DraOptions, inventory: Callable[[], GpuInventory],
                 read_claim: ClaimReader, slices: SliceStore, enforcement: Enforcement | None = None,
                 held_elsewhere: HeldElsewhere | None = None) -> None:
        self.driver = driver_name(domain)
        self.state = ClaimState(node, self.driver, inventory, read_claim, CdiSpecs(options.cdi_dir, domain),
                                options.checkpoint_path(self.driver), enforcement, held_elsewhere)
        self.server = DraPluginServer(self.driver, options.socket_path(self.driver), self.state)
        self.publisher = SlicePublisher(node, self.driver, slices, inventory)

    async def run(self, devices_changed: Callable[[int], Awaitable[int]], version: int) -> None:
        """Serve kubelet; once kubelet has registered the driver, publish the slice (again after
        every change of the cards). Why wait: kube-scheduler places claims as soon as the slice is
        there, and kubelet fails the prepare of a driver it has not registered yet, then retries
        after a back-off that grows (a pod waited over a minute in the end-to-end test)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.server.run())
            group.create_task(self._publish_once_registered(devices_changed, version))

    async def _publish_once_registered(self, devices_changed: Callable[[int], Awaitable[int]], version: int) -> None:
        await self.server.registered.wait()
        await self.publisher.run(devices_changed, version)
