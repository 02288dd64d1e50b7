"""The risk checks as the node agent runs them: look, detect, respond, every ``interval_s``.

Reads only what the agent and its usage monitor already hold (no extra /proc walk or NVML call of
its own), so a round costs microseconds per holder; where the interception library runs, it also
reads the accounting region of a container whose registered processes hold memory (one small file,
at most once a round). Nothing here stops the agent: a failing round is logged and the next one
runs.

How soon a container over its grant is found (docs/security.md, "The over-grant backstop"): the
monitor samples NVML every second and a round runs every :data:`CHECK_EVERY_S`, so within about
3 s of the driver counting the memory (measured: ``test_backstop_live.py``); a tampered region
needs a second sample to agree (:mod:`~gpupool.nodeagent.risk.confirm`), one round more.

No round judges anything before the agent has read its pods once in full (the first PodResources
list with every listed pod's view; :meth:`NodeAgent.live_pods` is ``None`` until then). The usage
monitor restores its holders from its state file before the agent starts, with the times they
first held their cards, so they are past the grace period at once; with no pods listed yet every
one of them had no grant, and a restarted agent reported its owners' own processes as
``ungranted-card`` until the next round (2 s), which ``--risk-action evict`` would have acted on.
A list that stays incomplete (a pod kubelet lists that the API cannot give) holds the checks for at
most :data:`LIST_WAIT_S`; then they run, with a warning, on what is known.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gpupool.core.model import CardSlice
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.isolation.backends import EnforcementState, IsolationBackend
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry
from gpupool.nodeagent.monitor.service import UsageMonitor
from gpupool.nodeagent.risk.backstop import DEFAULT_OVERHEAD_MIB
from gpupool.nodeagent.risk.confirm import Confirmation
from gpupool.nodeagent.risk.decider import RiskOpenDecider
from gpupool.nodeagent.risk.detector import (
    DEFAULT_GRACE_S,
    ContainerName,
    NodeView,
    RegionUse,
    Registered,
    Renewed,
    detect,
    grants_of,
)
from gpupool.nodeagent.risk.findings import Risk
from gpupool.nodeagent.risk.regions import RegionReader
from gpupool.nodeagent.risk.responder import RiskResponder
from gpupool.nodeagent.types import PodView

log = logging.getLogger(__name__)

CHECK_EVERY_S = 2.0
LIST_WAIT_S = 60.0
"""The longest the checks wait for the agent's first complete list of its pods."""
GRANT_MEMORY_S = 10.0
"""A container's grant still counts this long after the last PodResources list that showed it. A pod
being deleted (evicted, or deleted by its user) leaves kubelet's List at once while its processes
can hold the card until the runtime has killed them; judged on that list, an owner's own processes
were reported ``ungranted-card`` (seen in tests/e2e/test_reclaim_agent_killed_e2e.py when the owner
pod was deleted). A container never granted the card is never
remembered, so a real ungranted holder is still found at once."""


def shim_enforcing(state: EnforcementState) -> bool:
    """Whether the interception library is the backend and enforces now. Asked through the backend's
    state, because the library's backend may be wrapped (``dmem`` limits beside it, lending's
    checkpoint protocol), and each wrapper reports its inner backend's state."""
    return state.backend is IsolationBackend.SHIM and state.enforcing


def shim_registered(agent: NodeAgent, pods: list[PodView], state: EnforcementState) -> Registered | None:
    """Registered pids per container where the interception library enforces; ``None`` elsewhere.
    Each container's table is read once per view (reading it prunes exited processes in /proc)."""
    registry = getattr(agent.enforcement, "registry", None)  # wrappers pass the library's registry on
    if not isinstance(registry, ShimRegistry) or not shim_enforcing(state):
        return None
    uids = {(pod.namespace, pod.name): pod.uid for pod in pods}
    read: dict[ContainerName, frozenset[int]] = {}

    def registered(namespace: str, pod: str, container: str) -> frozenset[int]:
        name = (namespace, pod, container)
        if name not in read:
            uid = uids.get((namespace, pod))
            read[name] = frozenset(p.pid for p in registry.processes(uid, container)) if uid else frozenset()
        return read[name]

    return registered


def shim_renewed(agent: NodeAgent, pods: list[PodView], state: EnforcementState) -> tuple[Renewed, float] | None:
    """Each registered process's last renewal per container, and the stale age, where the interception
    library enforces; ``None`` elsewhere. Read once per container per view."""
    registry = getattr(agent.enforcement, "registry", None)
    if not isinstance(registry, ShimRegistry) or not shim_enforcing(state):
        return None
    uids = {(pod.namespace, pod.name): pod.uid for pod in pods}
    read: dict[ContainerName, dict[int, float]] = {}

    def renewed(namespace: str, pod: str, container: str) -> dict[int, float]:
        name = (namespace, pod, container)
        if name not in read:
            uid = uids.get((namespace, pod))
            read[name] = {p.pid: p.last_seen for p in registry.processes(uid, container)} if uid else {}
        return read[name]

    return renewed, registry.stale_after_s


class RiskMonitor:
    """Runs the detector on the agent's view and hands the result to the responder."""

    def __init__(self, agent: NodeAgent, monitor: UsageMonitor, responder: RiskResponder, *,
                 decider: RiskOpenDecider | None = None, grace_s: float = DEFAULT_GRACE_S,
                 interval_s: float = CHECK_EVERY_S, clock: Callable[[], float] = time.time,
                 overhead_mib: int = DEFAULT_OVERHEAD_MIB, regions: RegionReader | None = None) -> None:
        self.agent = agent
        self.monitor = monitor
        self.responder = responder
        self.decider = decider
        self.grace_s = grace_s
        self.interval_s = interval_s
        self.overhead_mib = overhead_mib
        """Driver memory allowed per process above the grant (``--risk-memory-tolerance``)."""
        self.regions = regions
        """The library's regions (under ``--state-dir``), read where the library enforces."""
        self.confirmation = Confirmation()
        self.rounds = 0
        self.ready = False
        """Whether the agent has listed its pods once in full (no round judges anything before)."""
        self._clock = clock
        self._waiting_since: float | None = None
        self._grants_seen: dict[ContainerName, tuple[float, dict[int, CardSlice]]] = {}

    def view(self) -> NodeView:
        """The node as the detector sees it now."""
        pods = self.agent.listed_pods()
        enforcement = self.agent.enforcement.state()
        region: RegionUse | None = None
        if self.regions is not None and shim_enforcing(enforcement):
            region = self.regions.for_pods(pods)
        heartbeats = shim_renewed(self.agent, pods, enforcement)
        renewed, stale_after_s = heartbeats if heartbeats is not None else (None, 30.0)
        now = self._clock()
        return NodeView(cards=self.monitor.cards, state=self.monitor.state, sample=self.monitor.last_sample,
                        grants=self._remembered(grants_of(self.agent.node, pods, self._claims()), now),
                        enforcing=enforcement.enforcing,
                        registered=shim_registered(self.agent, pods, enforcement), now=now,
                        overhead_mib=self.overhead_mib, region=region, renewed=renewed,
                        stale_after_s=stale_after_s)

    def _claims(self) -> list[PodView]:
        """The DRA claims the agent prepared (none without ``--dra``)."""
        return self.agent.claims_granted() if self.agent.claims_granted is not None else []

    def _remembered(self, grants: dict[ContainerName, dict[int, CardSlice]],
                    now: float) -> dict[ContainerName, dict[int, CardSlice]]:
        """``grants`` plus those a list showed within :data:`GRANT_MEMORY_S` (see there)."""
        for name, slices in grants.items():
            self._grants_seen[name] = (now, slices)
        self._grants_seen = {n: seen for n, seen in self._grants_seen.items() if now - seen[0] <= GRANT_MEMORY_S}
        return {**{n: slices for n, (_, slices) in self._grants_seen.items()}, **grants}

    async def step(self) -> list[Risk]:
        """One round; the risks that are new in it."""
        if not self.ready:
            now = self._clock()
            if self._waiting_since is None:
                self._waiting_since = now
                log.info("risk checks wait for the agent's first complete list of its pods")
            if self.agent.live_pods() is None:
                if now - self._waiting_since < LIST_WAIT_S:
                    return []
                log.warning("risk checks start without a complete list of the node's pods after %g s: holders of "
                            "pods not listed yet are judged without their grants", LIST_WAIT_S)
            else:
                log.info("risk checks start: the agent has listed its pods")
            self.ready = True
        self.rounds += 1
        view = self.view()
        sample_time = view.sample.time if view.sample is not None else None
        new = await self.responder.observe(self.confirmation.filter(detect(view, self.grace_s), sample_time))
        if self.decider is not None and self.decider.blocked:
            self.decider.keep_pods((pod.namespace, pod.name) for pod in self.agent.listed_pods())
        return new

    async def run(self) -> None:
        """Check every ``interval_s`` until cancelled."""
        while True:
            try:
                await self.step()
            except Exception:
                log.exception("risk check failed; retrying at the next round")
            await asyncio.sleep(self.interval_s)
