"""What the node says about enforcement: per card which backend holds its shares (and whether the
kernel's ``dmem`` controller caps its memory too), per container how many processes registered with
the agent, its heartbeat (how long ago its least recently renewed process renewed, and whether
that is stale) and its ``dmem`` limits; for ``/metrics`` and a section of ``/usage``.

One backend serves the whole node, so every card reports the same one; the series is per card all
the same, so a dashboard joins it with the per-card usage series, and a node whose cards differ
(e.g. MIG cards under another backend) needs no new series.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.isolation.backends import Enforcement, EnforcementState, IsolationBackend
from gpupool.nodeagent.isolation.dmem_limits import DmemReport
from gpupool.nodeagent.isolation.shim_registry import Heartbeat, ShimRegistry
from gpupool.nodeagent.public_text import public

_CARD_LABELS = ("node", "card", "uuid", "model")  # the labels of every per-card series of the agent


def _registry(enforcement: Enforcement) -> ShimRegistry | None:
    registry = getattr(enforcement, "registry", None)
    return registry if isinstance(registry, ShimRegistry) else None


def container_heartbeats(enforcement: Enforcement) -> dict[tuple[str, str, str], Heartbeat] | None:
    """(namespace, pod, container) → heartbeat where the interception library runs; ``None`` elsewhere."""
    registry = _registry(enforcement)
    return registry.heartbeats() if registry is not None else None


class IsolationCollector(Collector):
    """``gpupool_card_isolation_backend``, ``gpupool_card_isolation_enforced`` and, with the library,
    ``gpupool_container_registered_processes`` and the registration counters."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        node, enforcement = self.agent.node, self.agent.enforcement
        state = enforcement.state()
        backend = GaugeMetricFamily("gpupool_card_isolation_backend",
                                    "1 for the backend that enforces the card's shares (shim, mps, none)",
                                    labels=(*_CARD_LABELS, "backend"))
        enforced = GaugeMetricFamily("gpupool_card_isolation_enforced",
                                     "1 while the card's backend is enforcing its shares",
                                     labels=_CARD_LABELS)
        for card in self.agent.inventory.cards:
            for option in IsolationBackend:
                backend.add_metric([node, str(card.index), card.uuid, card.model, option.value],
                                   float(option is state.backend))
            enforced.add_metric([node, str(card.index), card.uuid, card.model], float(state.enforcing))
        yield backend
        yield enforced
        if state.dmem is not None:
            yield from self._dmem(state.dmem)
        registry = _registry(enforcement)
        if registry is None:
            return
        processes = GaugeMetricFamily("gpupool_container_registered_processes",
                                      "Live processes of a container registered with the node agent",
                                      labels=("node", "namespace", "pod", "container"))
        age = GaugeMetricFamily("gpupool_container_heartbeat_age_seconds",
                                "Seconds since the container's least recently renewed registered process renewed "
                                "its registration (0 without registered processes)",
                                labels=("node", "namespace", "pod", "container"))
        stale = GaugeMetricFamily("gpupool_container_heartbeat_stale",
                                  "1 while a registered process of the container has not renewed for longer than "
                                  "the stale age", labels=("node", "namespace", "pod", "container"))
        for (namespace, pod, container), beat in sorted(registry.heartbeats().items()):
            labels = [node, namespace, pod, container]
            processes.add_metric(labels, beat.processes)
            age.add_metric(labels, round(beat.age_s, 3))
            stale.add_metric(labels, float(beat.stale))
        yield processes
        yield age
        yield stale
        yield CounterMetricFamily("gpupool_shim_registrations_accepted", "Registrations accepted",
                                  value=registry.stats.accepted)
        yield CounterMetricFamily("gpupool_shim_registrations_renewed", "Registrations renewed (the heartbeat)",
                                  value=registry.stats.renewed)
        yield CounterMetricFamily("gpupool_shim_renewals_throttled",
                                  "Renewals answered but not recorded: sooner than half the interval",
                                  value=registry.stats.throttled)
        refused = CounterMetricFamily("gpupool_shim_registrations_refused", "Registrations refused, by reason",
                                      labels=("reason",))
        for reason, count in sorted(registry.stats.refused.items()):
            refused.add_metric([reason], count)
        yield refused


    def _dmem(self, report: DmemReport) -> Iterator[Metric]:
        node = self.agent.node
        regions = {c.card: c.region for c in report.cards}
        by_dmem = GaugeMetricFamily("gpupool_card_memory_enforced_by_dmem",
                                    "1 when the kernel's dmem controller caps the card's memory shares "
                                    "(its region is in dmem.capacity)", labels=(*_CARD_LABELS, "region"))
        for card in self.agent.inventory.cards:
            region = regions.get(card.index, "")
            by_dmem.add_metric([node, str(card.index), card.uuid, card.model, region], float(bool(region)))
        yield by_dmem
        limits = GaugeMetricFamily("gpupool_container_dmem_limit_bytes",
                                   "A container's device-memory limit on a card through dmem.max, by state "
                                   "(applied, waiting, refused, failed)",
                                   labels=("node", "namespace", "pod", "container", "card", "state"))
        for limit in report.limits:
            limits.add_metric([node, limit.namespace, limit.pod, limit.container, str(limit.card),
                               limit.state.value], limit.limit_bytes)
        yield limits


def _memory_detail(state: EnforcementState, card: int) -> str:
    """What caps a card's memory besides the backend: ``dmem`` with its region, or why not."""
    if state.dmem is None:
        return ""
    for region in state.dmem.cards:
        if region.card == card:
            return f"memory also by dmem ({region.region})" if region.region else f"no dmem: {region.reason}"
    return "no dmem: no PCI address for the card"


def isolation_table(agent: NodeAgent) -> str:
    """The ``/usage`` section: the backend per card, then registered processes per container."""
    enforcement = agent.enforcement
    state = enforcement.state()
    lines = ["", f"{'CARD':<5}{'ISOLATION':<11}{'ENFORCED':<10}DETAIL"]
    for card in agent.inventory.cards:
        detail = public("; ".join(d for d in (state.detail, _memory_detail(state, card.index)) if d))
        lines.append(f"{card.index:<5}{state.backend.value:<11}{'yes' if state.enforcing else 'no':<10}{detail}")
    registry = _registry(enforcement)
    if registry is not None:
        lines += ["", f"{'NAMESPACE/POD/CONTAINER':<48}{'REGISTERED PROCS':>17}{'HEARTBEAT AGE s':>17}  "
                      f"(stale after {registry.stale_after_s:g} s)"]
        for (namespace, pod, container), beat in sorted(registry.heartbeats().items()):
            name = f"{namespace}/{pod}/{container}" if namespace else f"{pod}/{container}"
            age = f"{beat.age_s:.0f}{' STALE' if beat.stale else ''}" if beat.processes else "-"
            lines.append(f"{name[:47]:<48}{beat.processes:>17}{age:>17}")
    if state.dmem is not None and state.dmem.limits:
        lines += ["", f"{'NAMESPACE/POD/CONTAINER':<48}{'CARD':<6}{'DMEM.MAX':>14}  STATE"]
        for limit in state.dmem.limits:
            name = f"{limit.namespace}/{limit.pod}/{limit.container}"
            why = f" ({public(limit.detail)})" if limit.detail else ""
            lines.append(f"{name[:47]:<48}{limit.card:<6}{limit.limit_bytes:>14}  {limit.state.value}{why}")
    return "\n".join(lines) + "\n"
