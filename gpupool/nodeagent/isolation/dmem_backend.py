"""A backend with the kernel's ``dmem`` controller beside it: the same grants, and ``dmem.max``.

Used where the node's kernel offers ``dmem`` (:func:`~gpupool.nodeagent.isolation.setup.build_enforcement`
decides): the library or MPS enforces as before, and the kernel also caps the container's device
memory on every card whose driver charges ``dmem``. The kernel's cap counts everything the driver
allocates for the container (contexts, the runtime's own buffers), so it can bind before the
library's count does; it is the one a program cannot get around.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from gpupool.nodeagent.isolation.backends import Enforcement, EnforcementState, LivePods
from gpupool.nodeagent.isolation.dmem_limits import DmemLimiter
from gpupool.nodeagent.types import GrantExtras, PodView

log = logging.getLogger(__name__)

PASS_INTERVAL_S = 1.0
"""How often waiting limits look for their container's cgroup (the container starts right after
Allocate; its first CUDA allocation is usually seconds later)."""


class DmemEnforcement:
    """:class:`~gpupool.nodeagent.isolation.backends.Enforcement`: ``inner`` plus ``dmem`` limits."""

    def __init__(self, inner: Enforcement, limiter: DmemLimiter, interval_s: float = PASS_INTERVAL_S) -> None:
        self.inner = inner
        self.limiter = limiter
        self._interval = interval_s
        self.registry = getattr(inner, "registry", None)  # the library's registrations, for the report

    def grant_extras(self, pod: PodView, container: str) -> GrantExtras:
        extras = self.inner.grant_extras(pod, container)
        self.limiter.want(pod, container)  # only after the inner backend granted
        return extras

    def state(self) -> EnforcementState:
        return dataclasses.replace(self.inner.state(), dmem=self.limiter.report())

    async def run(self, live_pods: LivePods) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.inner.run(live_pods))
            group.create_task(self._passes(live_pods))

    async def _passes(self, live_pods: LivePods) -> None:
        """Drop gone pods' entries, write what can be written, every :data:`PASS_INTERVAL_S`."""
        while True:
            live = live_pods()
            if live is not None:
                self.limiter.forget_gone(set(live))
            try:
                self.limiter.apply()
            except Exception:  # a bug in one pass must not end the agent's task group
                log.exception("dmem limit pass failed")
            await asyncio.sleep(self._interval)
