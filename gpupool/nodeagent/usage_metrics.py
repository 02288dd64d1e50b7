"""Prometheus series of the usage monitor, named so that DCGM and HAMi users find their way.

The mapping to the names of the NVIDIA DCGM exporter and HAMi's vGPU monitor is in docs/monitor.md
("Metrics"). Per-card series carry the labels of :data:`gpupool.nodeagent.metrics.CARD_LABELS`;
per-container series carry ``node``, ``namespace``, ``pod``, ``container`` and ``card``. Memory is
in MiB like the rest of gpupool's series.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.monitor.service import UsageMonitor
from gpupool.nodeagent.monitor.usage_state import DeviceState
from gpupool.nodeagent.usage_report import card_rows, container_rows

CARD_LABELS = ("node", "card", "uuid", "model")
CONTAINER_LABELS = ("node", "namespace", "pod", "container", "card")

CARD_USAGE_GAUGES = (
    ("gpupool_card_utilization_percent", "Percent of the last sample period a kernel ran on the card (NVML)"),
    ("gpupool_card_memory_used_mib", "Memory used on the card (NVML, MiB)"),
    ("gpupool_card_holders", "Processes holding the card's device file open"),
    ("gpupool_card_idle_seconds", "Seconds the card has been held without SM activity (0 unless idle)"),
)
CONTAINER_GAUGES = (
    ("gpupool_container_memory_used_mib", "Memory the container's processes use on the card (MiB)"),
    ("gpupool_container_memory_limit_mib", "Memory the container's grant allows on the card (MiB)"),
    ("gpupool_container_sm_utilization_percent", "SM utilisation of the container's processes on the card"),
    ("gpupool_container_compute_share_percent", "Compute share of the container's grant on the card (0: no limit)"),
)


class UsageCollector(Collector):
    """The monitor's per-card and per-container series, computed at scrape time."""

    def __init__(self, agent: NodeAgent, monitor: UsageMonitor) -> None:
        self.agent = agent
        self.monitor = monitor

    def describe(self) -> list[Metric]:
        return []  # collected lazily

    def collect(self) -> Iterator[Metric]:
        agent, monitor = self.agent, self.monitor
        inventory = agent.inventory
        cards = card_rows(monitor, inventory)
        families = {name: GaugeMetricFamily(name, doc, labels=CARD_LABELS) for name, doc in CARD_USAGE_GAUGES}
        state = GaugeMetricFamily("gpupool_card_state", "1 for the card's recorded state (free, busy, idle)",
                                  labels=(*CARD_LABELS, "state"))
        for row in cards:
            labels = [agent.node, str(row.card.index), row.card.uuid, row.card.model]
            values = (row.utilization_percent, row.memory_used_mib, row.holders, row.idle_seconds)
            for (name, _), value in zip(CARD_USAGE_GAUGES, values, strict=True):
                if value is not None:  # not sampled: no value rather than a made-up 0
                    families[name].add_metric(labels, float(value))
            for option in DeviceState:
                state.add_metric([*labels, option.value], float(row.state is option))
        yield from families.values()
        yield state
        transitions = CounterMetricFamily("gpupool_card_state_changes", "Cards going busy or idle while held",
                                          labels=(*CARD_LABELS, "state"))
        by_index = {row.card.index: row.card for row in cards}
        for (index, new), count in sorted(monitor.transitions.items()):
            card = by_index.get(index)
            if card is not None:
                transitions.add_metric([agent.node, str(index), card.uuid, card.model, new.value], count)
        yield transitions
        containers = {name: GaugeMetricFamily(name, doc, labels=CONTAINER_LABELS) for name, doc in CONTAINER_GAUGES}
        for c in container_rows(agent.node, monitor, inventory, agent.listed_pods()):
            labels = [agent.node, c.namespace, c.pod, c.container, str(c.card)]
            values = (c.memory_used_mib, c.memory_limit_mib, c.sm_percent, c.compute_share_percent)
            for (name, _), value in zip(CONTAINER_GAUGES, values, strict=True):
                containers[name].add_metric(labels, float(value))
        yield from containers.values()
        yield CounterMetricFamily("gpupool_monitor_sample_errors", "Usage samples that failed as a whole",
                                  value=monitor.sample_errors)
        yield CounterMetricFamily("gpupool_monitor_holders_released",
                                  "Holders dropped because their process exited or let go unseen (cards freed)",
                                  value=monitor.recorder.released)
        source = GaugeMetricFamily("gpupool_monitor_source_info", "The event source the monitor runs",
                                   labels=("node", "source"))
        source.add_metric([agent.node, monitor.source.name if monitor.source else "none"], 1.0)
        yield source
