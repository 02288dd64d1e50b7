"""Prometheus metrics of the extender: request counts and latencies, and per-card allocation.

Why a private registry: several extenders (tests, the benchmark) live in one process, and the
default global registry refuses a second metric of the same name. Per-card gauges are collected at
scrape time straight from the ledger, so they can never drift from what the extender decides on.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.extender.service import Ledger

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ExtenderMetrics:
    """The extender's metrics in their own registry (served on ``/metrics``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter("gpupool_extender_requests", "Extender requests by verb and outcome",
                                ["verb", "outcome"], registry=self.registry)
        self.latency = Histogram("gpupool_extender_request_seconds", "Extender request latency by verb",
                                 ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.bind_attempts = Counter("gpupool_extender_bind_conflicts",
                                     "Binds that had to re-evaluate after a 409 from the API",
                                     registry=self.registry)

    def observe(self, verb: str, outcome: str, seconds: float) -> None:
        """Count one request and its latency."""
        self.requests.labels(verb, outcome).inc()
        self.latency.labels(verb).observe(seconds)

    def watch_ledger(self, ledger: Ledger) -> None:
        """Export per-card allocation and booking conflicts read from the ledger at scrape time."""
        self.registry.register(LedgerCollector(ledger))
        self.registry.register(BookingProblemsCollector(ledger))


class LedgerCollector(Collector):
    """Per-card allocated/total memory and compute, and the cache's readiness."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def describe(self) -> list[Metric]:
        return []  # collected lazily; nothing to declare up front

    def collect(self) -> Iterator[Metric]:
        labels = ["node", "card", "uuid", "model"]
        mem_alloc = GaugeMetricFamily("gpupool_card_memory_allocated_mib", "Memory booked on a card (MiB)",
                                      labels=labels)
        mem_total = GaugeMetricFamily("gpupool_card_memory_total_mib", "Memory of a card (MiB)",
                                      labels=labels)
        compute_alloc = GaugeMetricFamily("gpupool_card_compute_allocated_permille",
                                          "Compute booked on a card (per-mille of the card)", labels=labels)
        synced = GaugeMetricFamily("gpupool_extender_cache_synced", "1 once nodes and pods are listed")
        synced.add_metric([], 1.0 if self.ledger.synced else 0.0)
        with self.ledger.lock:
            state = self.ledger.state
            for row, spec in enumerate(state.specs):
                if not state.present[row]:
                    continue
                for pos, card in enumerate(spec.cards):
                    values = [spec.name, str(card.index), card.uuid, card.model]
                    total = int(state.card_mem_total[row, pos])
                    mem_total.add_metric(values, total)
                    mem_alloc.add_metric(values, total - int(state.card_mem_free[row, pos]))
                    compute_alloc.add_metric(values, int(state.card_compute_total[row, pos])
                                             - int(state.card_compute_free[row, pos]))
        yield from (mem_alloc, mem_total, compute_alloc, synced)


class BookingProblemsCollector(Collector):
    """Claims the ledger cannot square (see :mod:`gpupool.extender.booking_problems`): an alert on
    either gauge above zero finds them without reading the logs."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def describe(self) -> list[Metric]:
        return []  # collected lazily; nothing to declare up front

    def collect(self) -> Iterator[Metric]:
        overcommitted = GaugeMetricFamily(
            "gpupool_extender_overcommitted_cards",
            "Cards whose bound pods claim more memory or compute than the card has (or share a whole card)")
        overcommitted.add_metric([], float(self.ledger.overcommitted_cards()))
        unreadable = GaugeMetricFamily(
            "gpupool_extender_unreadable_assignments",
            "Bound pods whose assignment cannot be read (their nodes take no GPU pods)")
        unreadable.add_metric([], float(self.ledger.unreadable_assignments()))
        yield from (overcommitted, unreadable)
