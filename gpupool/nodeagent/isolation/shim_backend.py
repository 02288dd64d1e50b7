"""The interception-library backend: grants carry its mounts and token, the agent serves registration.

At Allocate the container gets (paths in :mod:`gpupool.api.shim_contract`): the library (its copy
under the state directory, a host path), read-only;
an ``/etc/ld.so.preload`` naming it, read-only (so even a process started without the container's
environment loads it); its own directory, read-only, holding its grant (the limits the library
enforces whatever the environment says), its token and its accounting region; that region file
again, read-write, as a mount of its own (writable, not deletable); and the agent's socket
directory, read-only. Every call for one container returns the same, because the token is derived
from (pod UID, container), the grant from the pod's assignment, and the files are made
idempotently.

In the background the agent serves the registration socket and, every :data:`SWEEP_INTERVAL_S`,
removes the directories (and forgets the tokens and processes) of containers whose pod kubelet has
not listed for :data:`GONE_AFTER_S`: long enough that a PodResources hiccup or an agent restart
never removes a running container's accounting region.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from gpupool.api import environment as env
from gpupool.api.shim_contract import (
    CONTAINER_AGENT_SOCKET,
    CONTAINER_AGENT_SOCKET_DIR,
    CONTAINER_GRANT_DIR,
    CONTAINER_LIBRARY_PATH,
    CONTAINER_REGION_PATH,
    CONTAINER_SHIM_DIR,
    PRELOAD_PATH,
    REGION_FILE,
    encode_grant,
)
from gpupool.nodeagent.container_grant import GrantError
from gpupool.nodeagent.isolation.backends import EnforcementState, IsolationBackend, LivePods
from gpupool.nodeagent.isolation.shim_files import (
    ShimFileError,
    ShimLayout,
    existing_containers,
    install_library,
    prepare_container,
    prepare_node,
    remove_container,
)
from gpupool.nodeagent.isolation.shim_grant import node_grant
from gpupool.nodeagent.isolation.shim_registry import ContainerKey, ShimRegistry
from gpupool.nodeagent.isolation.shim_socket import RegistrationLimits, RegistrationServer
from gpupool.nodeagent.isolation.tokens import TokenSigner, load_or_create_secret
from gpupool.nodeagent.types import GrantExtras, Mount, PodView

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 10.0
GONE_AFTER_S = 120.0


class ShimEnforcement:
    """:class:`~gpupool.nodeagent.isolation.backends.Enforcement` with the interception library."""

    def __init__(self, library: str, layout: ShimLayout, registry: ShimRegistry,
                 compute_mode: str = env.COMPUTE_MODE_HARD, clock: Callable[[], float] = time.monotonic,
                 sweep_interval_s: float = SWEEP_INTERVAL_S, gone_after_s: float = GONE_AFTER_S,
                 registration: RegistrationLimits | None = None) -> None:
        if compute_mode not in env.COMPUTE_MODES:
            raise ValueError(f"compute mode {compute_mode!r}: expected one of {', '.join(env.COMPUTE_MODES)}")
        if not os.path.isfile(library):
            raise FileNotFoundError(f"interception library {library} does not exist (build it: `gpupool shim path`)")
        self.source = os.path.abspath(library)
        self.layout = layout
        self.registry = registry
        self.compute_mode = compute_mode
        limits = registration or RegistrationLimits()
        self.server = RegistrationServer(layout.socket, registry, limits.read_timeout_s, limits.max_connections)
        self._clock = clock
        self._sweep_interval = sweep_interval_s
        self._gone_after = gone_after_s
        self._gone_since: dict[str, float] = {}
        prepare_node(layout)
        self.library = install_library(layout, self.source)
        self._signer = TokenSigner(load_or_create_secret(layout.secret))
        for uid, container in existing_containers(layout):  # containers from before a restart
            registry.issue(self._signer.token(uid, container), uid, container)

    def grant_extras(self, pod: PodView, container: str) -> GrantExtras:
        token = self._signer.token(pod.uid, container)
        grant = encode_grant(node_grant(pod, container, token, self.compute_mode))
        try:
            host_dir = prepare_container(self.layout, pod.uid, container, token, grant)
        except ShimFileError as exc:
            raise GrantError(f"{pod.namespace}/{pod.name}/{container}: {exc}") from None
        self.registry.issue(token, pod.uid, container, pod.namespace, pod.name)
        envs = {env.SHIM_DIR: CONTAINER_SHIM_DIR, env.AGENT_SOCKET: CONTAINER_AGENT_SOCKET,
                env.SHIM_TOKEN: token, env.COMPUTE_MODE: self.compute_mode}
        mounts = (Mount(self.library, CONTAINER_LIBRARY_PATH, read_only=True),
                  Mount(self.layout.preload, PRELOAD_PATH, read_only=True),
                  Mount(host_dir, CONTAINER_GRANT_DIR, read_only=True),
                  Mount(os.path.join(host_dir, REGION_FILE), CONTAINER_REGION_PATH, read_only=False),
                  Mount(self.layout.socket_dir, CONTAINER_AGENT_SOCKET_DIR, read_only=True))
        return GrantExtras(envs, mounts)

    def state(self) -> EnforcementState:
        if not os.path.isfile(self.library):
            return EnforcementState(IsolationBackend.SHIM, False, f"library {self.library} is missing")
        return EnforcementState(IsolationBackend.SHIM, True)

    def sweep(self, live: dict[str, tuple[str, str]] | None) -> list[ContainerKey]:
        """Remove what belongs to pods gone for long enough; the containers removed."""
        self.registry.prune()
        if live is None:
            return []
        self.registry.name_pods(live)
        now = self._clock()
        known = set(self.registry.containers()) | set(existing_containers(self.layout))
        removed = []
        for uid, container in sorted(known):
            if uid in live:
                self._gone_since.pop(uid, None)
                continue
            if now - self._gone_since.setdefault(uid, now) < self._gone_after:
                continue
            remove_container(self.layout, uid, container)
            self.registry.forget((uid, container))
            removed.append((uid, container))
        for uid in {uid for uid, _ in removed}:
            self._gone_since.pop(uid, None)
        if removed:
            log.info("removed the directories of %d containers of deleted pods", len(removed))
        return removed

    async def run(self, live_pods: LivePods) -> None:
        try:
            await self.server.start()
        except OSError as exc:  # the limits hold without registration; the agent goes on
            log.error("registration socket %s not served: %s", self.layout.socket, exc)
        try:
            while True:
                await asyncio.sleep(self._sweep_interval)
                live = live_pods()
                self.sweep(dict(live) if live is not None else None)
        finally:
            await self.server.stop()
