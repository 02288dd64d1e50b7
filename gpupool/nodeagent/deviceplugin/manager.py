"""Runs the three resource servers through kubelet restarts: serve, register, watch, repeat."""

from __future__ import annotations

import asyncio
import logging
import os

from gpupool.api.names import DEFAULT_DOMAIN
from gpupool.nodeagent.deviceplugin.api import KUBELET_SOCKET
from gpupool.nodeagent.deviceplugin.registration import (
    RegistrationError,
    register,
    wait_for_restart,
    wait_for_socket,
)
from gpupool.nodeagent.deviceplugin.server import AllocationHandler, ResourcePluginServer

log = logging.getLogger(__name__)

#: Seconds without kubelet's socket before the first warning; each later one waits twice as long,
#: up to the last value (kubelet restarting takes a few seconds; a wrong directory is forever).
FIRST_MISSING_WARNING_S = 10.0
LAST_MISSING_WARNING_S = 300.0


def socket_name(resource: str, own_domain: str = DEFAULT_DOMAIN) -> str:
    """One file per resource: ``gpupool.io/gpu-mem`` → ``gpupool-gpu-mem.sock``; a foreign alias
    keeps its domain, so ``aliyun.com/gpu-mem`` (``gpupool-aliyun.com-gpu-mem.sock``) cannot
    overwrite gpupool's own ``gpu-mem`` socket."""
    domain, _, name = resource.rpartition("/")
    return f"gpupool-{name}.sock" if domain == own_domain else f"gpupool-{domain}-{name}.sock"


class DevicePluginManager:
    """Keeps every resource served and registered with the kubelet in ``plugin_dir``."""

    def __init__(self, plugin_dir: str, resources: tuple[str, ...], handler: AllocationHandler,
                 poll_s: float = 0.2, own_domain: str = DEFAULT_DOMAIN) -> None:
        self.plugin_dir = plugin_dir
        self.kubelet_socket = os.path.join(plugin_dir, KUBELET_SOCKET)
        self.servers = [ResourcePluginServer(r, os.path.join(plugin_dir, socket_name(r, own_domain)), handler)
                        for r in resources]
        self.poll_s = poll_s
        self.registered = asyncio.Event()

    async def _wait_for_kubelet(self) -> None:
        """Wait for kubelet's registration socket, saying so at start and again (less often) while
        it is missing: a wrong ``--plugin-dir`` otherwise waits here forever without a word."""
        log.info("waiting for kubelet's registration socket %s", self.kubelet_socket)
        warn_after = FIRST_MISSING_WARNING_S
        while True:
            try:
                async with asyncio.timeout(warn_after):  # not wait_for: it can swallow a cancellation (3.11)
                    await wait_for_socket(self.kubelet_socket, self.poll_s)
                return
            except TimeoutError:
                log.warning("no kubelet registration socket at %s after %g s: nothing is advertised to "
                            "kubelet and this node gets no gpupool pods until it appears; is --plugin-dir "
                            "kubelet's device-plugins directory (usually /var/lib/kubelet/device-plugins)?",
                            self.kubelet_socket, warn_after)
                warn_after = min(warn_after * 2, LAST_MISSING_WARNING_S)

    async def run(self) -> None:
        """Serve and register; on kubelet restart do it again; until cancelled."""
        try:
            while True:
                await self._wait_for_kubelet()
                for server in self.servers:
                    await server.start()
                try:
                    for server in self.servers:
                        await register(self.kubelet_socket, os.path.basename(server.socket_path),
                                       server.resource)
                    self.registered.set()
                    log.info("registered %d resources with kubelet", len(self.servers))
                    reason = await wait_for_restart(self.kubelet_socket,
                                                    [s.socket_path for s in self.servers], self.poll_s)
                    log.warning("re-registering: %s", reason)
                except RegistrationError as exc:
                    log.error("%s; retrying", exc)
                    await asyncio.sleep(1.0)
                self.registered.clear()
                for server in self.servers:
                    await server.stop()
        finally:
            for server in self.servers:
                await server.stop()
