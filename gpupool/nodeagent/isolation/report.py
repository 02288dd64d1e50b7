"""What the node says about enforcement: per card which backend holds its shares, per container how
many processes registered with the agent; for ``/metrics`` and a section of ``/usage``.

One backend serves the whole node, so every card reports the same one; the series is per card all
the same, so a dashboard joins it with the per-card usage series, and a node whose cards differ
(e.g. MIG cards under another backend) needs no new series.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.isolation.backends import Enforcement, IsolationBackend
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry

_CARD_LABELS = ("node", "card", "uuid", "model")  # the labels of every per-card series of the agent


def _registry(enforcement: Enforcement) -> ShimRegistry | None:
    registry = getattr(enforcement, "registry", None)
    return registry if isinstance(registry, ShimRegistry) else None


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
        registry = _registry(enforcement)
        if registry is None:
            return
        processes = GaugeMetricFamily("gpupool_container_registered_processes",
                                      "Live processes of a container registered with the node agent",
                                      labels=("node", "namespace", "pod", "container"))
        for (namespace, pod, container), count in sorted(registry.counts().items()):
            processes.add_metric([node, namespace, pod, container], count)
        yield processes
        yield CounterMetricFamily("gpupool_shim_registrations_accepted", "Registrations accepted",
                                  value=registry.stats.accepted)
        refused = CounterMetricFamily("gpupool_shim_registrations_refused", "Registrations refused, by reason",
                                      labels=("reason",))
        for reason, count in sorted(registry.stats.refused.items()):
            refused.add_metric([reason], count)
        yield refused


def isolation_table(agent: NodeAgent) -> str:
    """The ``/usage`` section: the backend per card, then registered processes per container."""
    enforcement = agent.enforcement
    state = enforcement.state()
    lines = ["", f"{'CARD':<5}{'ISOLATION':<11}{'ENFORCED':<10}DETAIL"]
    for card in agent.inventory.cards:
        lines.append(f"{card.index:<5}{state.backend.value:<11}{'yes' if state.enforcing else 'no':<10}"
                     f"{state.detail}")
    registry = _registry(enforcement)
    if registry is not None:
        lines += ["", f"{'NAMESPACE/POD/CONTAINER':<48}{'REGISTERED PROCS':>17}"]
        for (namespace, pod, container), count in sorted(registry.counts().items()):
            name = f"{namespace}/{pod}/{container}" if namespace else f"{pod}/{container}"
            lines.append(f"{name[:47]:<48}{count:>17}")
    return "\n".join(lines) + "\n"
