"""Prometheus series of the risk checks (on the agent's ``/metrics``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.nodeagent.risk.findings import RiskAction, RiskKind
from gpupool.nodeagent.risk.service import RiskMonitor


class RiskCollector(Collector):
    """Risks found (by kind and the action taken), risks active now, cordoned cards, refused opens."""

    def __init__(self, risks: RiskMonitor) -> None:
        self.risks = risks

    def describe(self) -> list[Metric]:
        return []  # collected lazily

    def collect(self) -> Iterator[Metric]:
        node = self.risks.agent.node
        responder = self.risks.responder
        found = CounterMetricFamily("gpupool_risk_detected", "Risks found on this node's GPUs, by kind and the "
                                    "action taken", labels=("node", "kind", "action"))
        for kind in RiskKind:
            for action in RiskAction:
                found.add_metric([node, kind.value, action.value], responder.stats.detected[(kind, action)])
        yield found
        active = GaugeMetricFamily("gpupool_risk_active", "Risks present at the last check", labels=("node", "kind"))
        counts = Counter(risk.kind for risk in responder.active.values())
        for kind in RiskKind:
            active.add_metric([node, kind.value], counts[kind])
        yield active
        cordoned = GaugeMetricFamily("gpupool_card_cordoned", "1 while the card is cordoned for a risk",
                                     labels=("node", "card"))
        for card in self.risks.agent.inventory.cards:
            cordoned.add_metric([node, str(card.index)], float(card.index in responder.cordoned))
        yield cordoned
        denied = self.risks.decider.denied if self.risks.decider is not None else 0
        refused = CounterMetricFamily("gpupool_risk_opens_refused", "Opens of GPU devices refused to isolated "
                                      "containers", labels=("node",))
        refused.add_metric([node], denied)
        yield refused
        yield CounterMetricFamily("gpupool_risk_event_failures", "Risk events that could not be posted",
                                  value=responder.stats.event_failures)
        yield CounterMetricFamily("gpupool_risk_eviction_failures", "Evictions the API refused or that failed",
                                  value=responder.stats.eviction_failures)
