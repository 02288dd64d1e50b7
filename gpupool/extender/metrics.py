"""Prometheus metrics of the extender: request counts and latencies, and cluster-wide ledger totals.

Why a private registry: several extenders (tests, the benchmark) live in one process, and the
default global registry refuses a second metric of the same name.

Why totals only, no per-card series: a large ledger has tens of thousands of cards, and a series per
card makes a scrape hold the ledger lock and the event loop for a time that grows with the cluster,
time in which filter and prioritize wait (docs/extender.md, "Scrapes during filter and prioritize").
A scrape copies a handful of arrays under the lock (:meth:`LedgerTotals.read`) and sums them outside
it; its size does not grow with the cluster. Per-card series come from the node agents, each for its
own cards (:mod:`gpupool.nodeagent.metrics`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.core.lent import LentTotals
from gpupool.core.model import CardMode
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.core.units import BYTES_PER_MIB, COMPUTE_PER_CARD
from gpupool.extender.booking_keeper import ASSUMPTION_ENDS, RELEASE_REASONS
from gpupool.extender.booking_problems import BookingProblems
from gpupool.extender.borrowing import FilterOutcome, Lending

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

UNHEALTHY = "unhealthy"
"""The ``state`` of a card whose node reports it unhealthy, whatever it holds."""

CARD_STATES: tuple[tuple[str, CardMode], ...] = (
    ("idle", CardMode.IDLE), ("shared", CardMode.SHARED), ("exclusive", CardMode.EXCLUSIVE))
"""The ``state`` label of a healthy card by its booking mode."""


class LedgerFigures(Protocol):
    """What a scrape reads of the ledger (:class:`gpupool.extender.cache.ClusterCache`): its state
    and readiness, and the counts of its bookings, problems, loans and assumptions.

    Why its own protocol: these are the ledger's figures for ``/metrics``, not what the service
    decides with (:class:`gpupool.extender.service.Ledger`); the wiring code hands the concrete
    cache to both.
    """

    lock: threading.RLock
    state: ClusterState
    node_problems: dict[str, str]

    @property
    def synced(self) -> bool:
        """True once the ledger reflects a full list of nodes and pods."""

    @property
    def problems(self) -> BookingProblems:
        """Over-committed cards and unreadable claims; read under ``lock``."""

    @property
    def released_bookings(self) -> Mapping[str, int]:
        """Bookings given back because their pod ended, by how; read under ``lock``."""

    @property
    def lending(self) -> Lending:
        """The borrower rules, with their filter outcomes and placements counted."""

    @property
    def assumed_pods(self) -> int:
        """Pods the filter's assumptions hold now; read under ``lock``."""

    @property
    def assumption_ends(self) -> Mapping[str, int]:
        """Assumptions ended, by how; read under ``lock``."""


class ExtenderMetrics:
    """The extender's metrics in their own registry (served on ``/metrics``): the HTTP layer's
    request counts and latencies, and, given a ``ledger``, its cluster-wide totals read at scrape
    time (the wiring code passes the cache; the HTTP layer never reaches into it)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, ledger: LedgerFigures | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter("gpupool_extender_requests", "Extender requests by verb and outcome",
                                ["verb", "outcome"], registry=self.registry)
        self.latency = Histogram("gpupool_extender_request_seconds", "Extender request latency by verb",
                                 ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.bind_attempts = Counter("gpupool_extender_bind_conflicts",
                                     "Binds that had to re-evaluate after a 409 from the API",
                                     registry=self.registry)
        self.binds_in_flight = Gauge("gpupool_extender_binds_in_flight",
                                     "Binds started and not yet answered (each holds a booking)",
                                     registry=self.registry)
        if ledger is not None:
            self.watch_ledger(ledger)

    def observe(self, verb: str, outcome: str, seconds: float) -> None:
        """Count one request and its latency."""
        self.requests.labels(verb, outcome).inc()
        self.latency.labels(verb).observe(seconds)

    def watch_ledger(self, ledger: LedgerFigures) -> None:
        """Export the ledger's cluster-wide totals and its booking conflicts, read at scrape time."""
        self.registry.register(LedgerCollector(ledger))


@dataclass(frozen=True)
class CardArrays:
    """Copies of the ledger's per-card arrays a scrape sums (nodes x card slots).

    Why copies: copying takes microseconds under the lock; the sums then run without it.
    """

    present: BoolArray
    exists: BoolArray
    healthy: BoolArray
    mode: IntArray
    memory_total: IntArray
    memory_free: IntArray
    compute_total: IntArray
    compute_free: IntArray


@dataclass(frozen=True)
class LedgerTotals:
    """What the extender exports about its ledger: cluster-wide sums over present nodes."""

    synced: bool
    nodes: int
    nodes_with_problem: int
    pods_booked: int
    cards_by_state: tuple[tuple[str, int], ...]
    memory_total_mib: int
    memory_allocated_mib: int
    compute_total_permille: int
    compute_allocated_permille: int
    overcommitted_cards: int
    unreadable_assignments: int
    bookings_released: tuple[tuple[str, int], ...] = ()
    """Bookings given back because their pod ended, by how (:data:`RELEASE_REASONS` order)."""
    lent: LentTotals = field(default_factory=LentTotals)
    """The loans the nodes publish and the borrowers booked on them."""
    lending_filters: tuple[tuple[str, int], ...] = ()
    """Filter answers that asked lent capacity, by outcome (:class:`FilterOutcome` order)."""
    borrowers_placed: int = 0
    assumed_pods: int = 0
    """Pods whose filter's choice is booked until their bind (``ASSUMED``)."""
    assumptions_ended: tuple[tuple[str, int], ...] = ()
    """Assumptions ended, by how (:data:`ASSUMPTION_ENDS` order)."""

    @classmethod
    def read(cls, ledger: LedgerFigures) -> LedgerTotals:
        """Copy what the totals need under the ledger's lock, then sum outside it."""
        with ledger.lock:
            state = ledger.state
            arrays = CardArrays(
                present=state.present.copy(), exists=state.card_exists.copy(),
                healthy=state.card_healthy.copy(), mode=state.card_mode.copy(),
                memory_total=state.card_mem_total.copy(), memory_free=state.card_mem_free.copy(),
                compute_total=state.card_compute_total.copy(), compute_free=state.card_compute_free.copy())
            problems = len(ledger.node_problems)
            overcommitted = ledger.problems.overcommitted_cards()
            unreadable = len(ledger.problems.unreadable)
            booked = len(state.placements)
            synced = ledger.synced
            released = tuple((reason, ledger.released_bookings.get(reason, 0)) for reason in RELEASE_REASONS)
            lent = state.lent.totals()
            filters = tuple((outcome.value, ledger.lending.filters[outcome]) for outcome in FilterOutcome)
            placed = ledger.lending.placed
            assumed = ledger.assumed_pods
            ends = tuple((how, ledger.assumption_ends.get(how, 0)) for how in ASSUMPTION_ENDS)
        totals = cls.summarise(arrays, synced=synced, nodes_with_problem=problems, pods_booked=booked,
                               overcommitted_cards=overcommitted, unreadable_assignments=unreadable)
        return replace(totals, bookings_released=released, lent=lent, lending_filters=filters,
                       borrowers_placed=placed, assumed_pods=assumed, assumptions_ended=ends)

    @classmethod
    def summarise(cls, arrays: CardArrays, *, synced: bool, nodes_with_problem: int, pods_booked: int,
                  overcommitted_cards: int = 0, unreadable_assignments: int = 0) -> LedgerTotals:
        """The totals of a copy: cards of present nodes only (a removed node keeps its row)."""
        cards = arrays.exists & arrays.present[:, None]
        healthy = cards & arrays.healthy
        by_state = [(name, int(np.count_nonzero(healthy & (arrays.mode == mode))))
                    for name, mode in CARD_STATES]
        by_state.append((UNHEALTHY, int(np.count_nonzero(cards & ~arrays.healthy))))
        memory_total = int(arrays.memory_total[cards].sum())
        compute_total = int(arrays.compute_total[cards].sum())
        return cls(
            synced=synced, nodes=int(np.count_nonzero(arrays.present)),
            nodes_with_problem=nodes_with_problem, pods_booked=pods_booked,
            cards_by_state=tuple(by_state),
            memory_total_mib=memory_total,
            memory_allocated_mib=memory_total - int(arrays.memory_free[cards].sum()),
            compute_total_permille=compute_total,
            compute_allocated_permille=compute_total - int(arrays.compute_free[cards].sum()),
            overcommitted_cards=overcommitted_cards, unreadable_assignments=unreadable_assignments)


TOTAL_GAUGES: tuple[tuple[str, str, Callable[[LedgerTotals], float]], ...] = (
    ("gpupool_extender_cache_synced", "1 once nodes and pods are listed", lambda t: float(t.synced)),
    ("gpupool_cluster_nodes", "Nodes in the ledger", lambda t: t.nodes),
    ("gpupool_cluster_nodes_with_problem",
     "Nodes whose inventory or served aliases are refused (no pod is placed there)",
     lambda t: t.nodes_with_problem),
    ("gpupool_cluster_pods_booked", "Pods holding GPU resources in the ledger (binds in flight and assumed "
     "pods included)", lambda t: t.pods_booked),
    ("gpupool_extender_assumed_pods", "Pods the filter passed one node whose bind has not come yet (their cards "
     "are booked as assumed)", lambda t: t.assumed_pods),
    ("gpupool_cluster_gpu_memory_total_bytes", "Memory of every card (bytes)",
     lambda t: t.memory_total_mib * BYTES_PER_MIB),
    ("gpupool_cluster_gpu_memory_allocated_bytes", "Memory booked on the cards (bytes)",
     lambda t: t.memory_allocated_mib * BYTES_PER_MIB),
    ("gpupool_cluster_gpu_compute_total_cards", "Compute of every card, in whole cards (1: one card's compute)",
     lambda t: t.compute_total_permille / COMPUTE_PER_CARD),
    ("gpupool_cluster_gpu_compute_allocated_cards", "Compute booked on the cards, in whole cards",
     lambda t: t.compute_allocated_permille / COMPUTE_PER_CARD),
    ("gpupool_extender_overcommitted_cards",
     "Cards whose bound pods claim more memory or compute than the card has (or share a whole card)",
     lambda t: t.overcommitted_cards),
    ("gpupool_extender_unreadable_assignments",
     "Bound pods whose assignment cannot be read (their nodes take no GPU pods)",
     lambda t: t.unreadable_assignments),
    ("gpupool_cluster_lending_nodes", "Nodes that lend at least one idle card (docs/lending.md)",
     lambda t: t.lent.lending_nodes),
    ("gpupool_cluster_borrowers_booked", "Pods booked on lent capacity", lambda t: t.lent.borrowers),
    ("gpupool_cluster_lent_memory_bytes", "Memory the nodes lend on idle cards (bytes)",
     lambda t: t.lent.lent_memory_mib * BYTES_PER_MIB),
    ("gpupool_cluster_borrowed_memory_bytes", "Memory borrowers hold on lent cards (bytes)",
     lambda t: t.lent.borrowed_memory_mib * BYTES_PER_MIB),
)
"""Name, help and value of each unlabelled gauge (one row per total of :class:`LedgerTotals`)."""


class LedgerCollector(Collector):
    """The ledger's totals as gauges; one short lock hold per scrape."""

    def __init__(self, ledger: LedgerFigures) -> None:
        self.ledger = ledger

    def describe(self) -> list[Metric]:
        return []  # collected lazily; nothing to declare up front

    def collect(self) -> Iterator[Metric]:
        totals = LedgerTotals.read(self.ledger)
        for name, documentation, value in TOTAL_GAUGES:
            yield GaugeMetricFamily(name, documentation, value=value(totals))
        cards = GaugeMetricFamily("gpupool_cluster_cards", "Cards by state: idle, shared, exclusive, "
                                  "or unhealthy (whatever they hold)", labels=["state"])
        for state, count in totals.cards_by_state:
            cards.add_metric([state], count)
        yield cards
        released = CounterMetricFamily("gpupool_extender_bookings_released",
                                        "Bookings given back because their pod ended: deleted, finished "
                                        "(Succeeded/Failed), or cleared (holds nothing any more)",
                                        labels=["reason"])
        for reason, count in totals.bookings_released:
            released.add_metric([reason], count)
        yield released
        ended = CounterMetricFamily("gpupool_extender_assumptions_ended",
                                    "Filter assumptions ended, by how: reserved (its bind took it over), moved "
                                    "(bound elsewhere), replaced (filtered again), refused (its bind booked "
                                    "nothing), expired, pod_ended, seen (bound by another writer), conflict",
                                    labels=["how"])
        for how, count in totals.assumptions_ended:
            ended.add_metric([how], count)
        yield ended
        yield from lending_families(totals)


def lending_families(totals: LedgerTotals) -> Iterator[Metric]:
    """The lending series whose values carry a label or count events (docs/extender.md, Metrics)."""
    lent = GaugeMetricFamily("gpupool_cluster_lent_cards", "Cards by lending state: lent (a loan now) or "
                             "withdrawn (no loan, borrowers still booked while the node reclaims them)",
                             labels=["state"])
    lent.add_metric(["lent"], totals.lent.lent_cards)
    lent.add_metric(["withdrawn"], totals.lent.withdrawn_cards)
    yield lent
    filters = CounterMetricFamily("gpupool_extender_lending_filters",
                                  "Filters of pods that fit no free capacity and asked lent capacity, by "
                                  "outcome: passed, held_for_earlier (every loan that fits is held for an "
                                  "older waiting pod), no_loan_fits, not_a_borrower", labels=["outcome"])
    for outcome, count in totals.lending_filters:
        filters.add_metric([outcome], count)
    yield filters
    yield CounterMetricFamily("gpupool_extender_borrowers_placed", "Binds that booked a pod on lent capacity",
                              value=totals.borrowers_placed)
