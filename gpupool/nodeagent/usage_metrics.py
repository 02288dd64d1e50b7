"""Prometheus series of the usage monitor, named so that DCGM and HAMi users find their way.

The mapping to the names of the NVIDIA DCGM exporter and HAMi's vGPU monitor is in docs/monitor.md
("Metrics"). Per-card series carry the labels of :data:`gpupool.nodeagent.metrics.CARD_LABELS`;
per-container series carry ``node``, ``namespace``, ``pod``, ``container`` and ``card`` (the
*workload's* namespace, pod and container: a Prometheus scraping the agent keeps them with
``honorLabels``, docs/deploy.md "Monitoring"). Units follow Prometheus's conventions like the rest of
gpupool's series: memory in bytes, utilisation and shares as ratios (0 to 1).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.core.units import BYTES_PER_MIB
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.monitor.service import UsageMonitor
from gpupool.nodeagent.monitor.usage_state import DeviceState
from gpupool.nodeagent.usage_report import card_rows, container_rows

CARD_LABELS = ("node", "card", "uuid", "model")
CONTAINER_LABELS = ("node", "namespace", "pod", "container", "card")

CHANGE_STATES = (DeviceState.BUSY, DeviceState.IDLE)
"""The states ``gpupool_card_state_changes_total`` counts changes to."""

CARD_USAGE_GAUGES = (
    ("gpupool_card_utilization_ratio", "Fraction of the last sample period a kernel ran on the card (NVML)"),
    ("gpupool_card_memory_used_bytes", "Memory used on the card (NVML, bytes)"),
    ("gpupool_card_holders", "Processes holding the card's device file open"),
    ("gpupool_card_idle_seconds", "Seconds the card has been held without SM activity (0 unless idle)"),
)
CONTAINER_GAUGES = (
    ("gpupool_container_memory_used_bytes", "Memory the container's processes use on the card (bytes)"),
    ("gpupool_container_memory_limit_bytes", "Memory the container's grant allows on the card (bytes)"),
    ("gpupool_container_sm_utilization_ratio", "SM utilisation of the container's processes on the card (0 to 1)"),
    ("gpupool_container_compute_share_ratio",
     "Compute share of the container's grant on the card, as a fraction of the card (0: no limit)"),
)

def ratio(percent: float | None) -> float | None:
    """A percentage as Prometheus's 0-to-1 ratio (None: not sampled)."""
    return None if percent is None else percent / 100


def mib_bytes(mib: float | None) -> float | None:
    """MiB as bytes (None: not sampled)."""
    return None if mib is None else mib * BYTES_PER_MIB


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
            sampled: tuple[float | None, ...] = (ratio(row.utilization_percent), mib_bytes(row.memory_used_mib),
                                                 row.holders, row.idle_seconds)
            for (name, _), value in zip(CARD_USAGE_GAUGES, sampled, strict=True):
                if value is not None:  # not sampled: no value rather than a made-up 0
                    families[name].add_metric(labels, float(value))
            for option in DeviceState:
                state.add_metric([*labels, option.value], float(row.state is option))
        yield from families.values()
        yield state
        transitions = CounterMetricFamily("gpupool_card_state_changes", "Cards going busy or idle while held",
                                          labels=(*CARD_LABELS, "state"))
        # Every card and state from the start, at 0 until it happens: increase() over a counter that
        # appears only at its first change misses that change, and a dashboard panel stays empty.
        for row in cards:
            for new in CHANGE_STATES:
                transitions.add_metric([agent.node, str(row.card.index), row.card.uuid, row.card.model, new.value],
                                       monitor.transitions.get((row.card.index, new), 0))
        yield transitions
        containers = {name: GaugeMetricFamily(name, doc, labels=CONTAINER_LABELS) for name, doc in CONTAINER_GAUGES}
        for c in container_rows(agent.node, monitor, inventory, agent.listed_pods(), agent.prepared_claims()):
            labels = [agent.node, c.namespace, c.pod, c.container, str(c.card)]
            amounts = (c.memory_used_mib * BYTES_PER_MIB, c.memory_limit_mib * BYTES_PER_MIB, c.sm_percent / 100,
                       c.compute_share_percent / 100)
            for (name, _), amount in zip(CONTAINER_GAUGES, amounts, strict=True):
                containers[name].add_metric(labels, float(amount))
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
