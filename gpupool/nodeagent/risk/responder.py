"""Act on risks by the cluster's policy: an event and a count always, then the chosen action.

Each risk is acted on once, when it first appears (same process, or same container for a
container-wide one), and forgotten when it is gone. An action that cannot be carried out falls back
to reporting and says why in the event: refusing opens needs an event source that holds opens
(fanotify), eviction may be refused (a PodDisruptionBudget, the API away). A cordoned card stays
cordoned while any risk remains on it, and is offered again once none does.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from gpupool.nodeagent.risk.decider import RiskOpenDecider
from gpupool.nodeagent.risk.findings import EVENT_REASONS, Risk, RiskAction, RiskKind

log = logging.getLogger(__name__)

PostWarning = Callable[[str, str, str, str], Awaitable[None]]
"""(namespace, pod, reason, message) → a Warning event on the pod."""
Evict = Callable[[str, str], Awaitable[None]]
"""(namespace, pod) → evict it through the Eviction API; raises when refused."""
Cordon = Callable[[Mapping[int, str]], Awaitable[None]]
"""The cards to report unhealthy now (card → reason); every other card is offered again."""


@dataclass
class RiskStats:
    """Counters for metrics: risks found by kind and the action taken, failures by step."""

    detected: Counter[tuple[RiskKind, RiskAction]] = field(default_factory=Counter)
    event_failures: int = 0
    eviction_failures: int = 0


class RiskResponder:
    """Keeps the active risks and carries out ``action`` on each new one."""

    def __init__(self, action: RiskAction, post: PostWarning, *, decider: RiskOpenDecider | None = None,
                 can_refuse: Callable[[], bool] = lambda: False, evict: Evict | None = None,
                 cordon: Cordon | None = None) -> None:
        if action is RiskAction.EVICT and evict is None:
            raise ValueError("--risk-action evict needs an eviction client")
        if action is RiskAction.CORDON_CARD and cordon is None:
            raise ValueError("--risk-action cordon-card needs the device plugin's cordon")
        self.action = action
        self.stats = RiskStats()
        self.active: dict[tuple[str, int, str, str, str, int, int], Risk] = {}
        self.cordoned: dict[int, str] = {}
        self._post = post
        self._decider = decider
        self._can_refuse = can_refuse
        self._evict = evict
        self._cordon = cordon
        self._evicted: set[tuple[str, str]] = set()

    async def observe(self, risks: list[Risk]) -> list[Risk]:
        """Take this round's risks: act on the new ones, forget those gone; the new ones."""
        current = {risk.key: risk for risk in risks}
        new = [risk for key, risk in current.items() if key not in self.active]
        for key in self.active.keys() - current.keys():
            gone = self.active[key]
            log.info("risk gone: %s on GPU %d by %s/%s/%s (pid %d)", gone.kind, gone.card, gone.namespace, gone.pod,
                     gone.container, gone.pid)
        self.active = current
        for risk in new:
            applied, note = await self._act(risk)
            self.stats.detected[(risk.kind, applied)] += 1
            log.warning("risk: %s/%s %s [%s] %s", risk.namespace, risk.pod, risk.message(), risk.kind, note)
            await self._report(risk, note)
        if self.action is RiskAction.CORDON_CARD:
            await self._update_cordons()
        return new

    async def _act(self, risk: Risk) -> tuple[RiskAction, str]:
        if self.action is RiskAction.REFUSE_OPENS:
            if self._decider is None or not self._can_refuse() or not risk.container_id:
                return RiskAction.REPORT, ("action: report only (refuse-opens needs the kernel's device gate or an "
                                           "event source that holds opens, fanotify, and the container's ID)")
            self._decider.block(risk.container_id, f"{risk.kind} on GPU {risk.card}", (risk.namespace, risk.pod))
            return RiskAction.REFUSE_OPENS, "action: the container's further opens of GPU devices are refused"
        if self.action is RiskAction.EVICT and self._evict is not None:
            pod = (risk.namespace, risk.pod)
            if pod in self._evicted:
                return RiskAction.EVICT, "action: the pod is being evicted"
            try:
                await self._evict(*pod)
            except Exception as exc:
                self.stats.eviction_failures += 1
                return RiskAction.REPORT, f"action: eviction refused ({getattr(exc, 'reason', None) or exc})"
            self._evicted.add(pod)
            return RiskAction.EVICT, "action: the pod is evicted"
        if self.action is RiskAction.CORDON_CARD:
            return RiskAction.CORDON_CARD, f"action: GPU {risk.card} is cordoned (no new grants) while a risk remains"
        return RiskAction.REPORT, "action: report"

    async def _report(self, risk: Risk, note: str) -> None:
        try:
            await self._post(risk.namespace, risk.pod, EVENT_REASONS[risk.kind], f"{risk.message()}; {note}")
        except Exception as exc:  # the action stands; only its event is lost
            self.stats.event_failures += 1
            log.warning("could not post the risk event on %s/%s: %s", risk.namespace, risk.pod, exc)

    async def _update_cordons(self) -> None:
        wanted: dict[int, str] = {}
        for risk in self.active.values():
            wanted.setdefault(risk.card, f"gpupool risk: {risk.kind} by {risk.namespace}/{risk.pod}/{risk.container}")
        if wanted != self.cordoned and self._cordon is not None:
            await self._cordon(wanted)
            self.cordoned = wanted
