"""Prometheus metrics of one node agent: its own cards and what gpupool's assignments book on them.

Why per-card series live here and not in the extender: the extender's ledger holds every card of the
cluster, and writing a series for each stalled its scheduling answers on large clusters; each agent
has only its own few cards, and Prometheus gathers them from all nodes. The values are what the pods
kubelet lists on this node were assigned (the same rule the extender books by: an init container
holds its cards alone, before the app containers), so a card whose booked memory exceeds its total
shows an over-commitment the node actually runs.

Served on the agent's own event loop: its state changes only there, so a scrape reads it without a
lock, and a node's handful of cards renders in well under a millisecond.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.api.usage_report import USAGE_REPORT_PATH, encode_usage_report
from gpupool.core.model import GpuCard
from gpupool.core.units import BYTES_PER_MIB, COMPUTE_PER_CARD
from gpupool.netguard.limits import ServerLimits
from gpupool.netguard.site import BoundedSite, bounded_runner
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.isolation.report import IsolationCollector, container_heartbeats, isolation_table
from gpupool.nodeagent.remote_usage import (
    RemoteBooked,
    RemoteClientRow,
    remote_booked,
    remote_client_rows,
    remote_table,
)
from gpupool.nodeagent.types import PodView
from gpupool.nodeagent.usage_metrics import UsageCollector
from gpupool.nodeagent.usage_report import usage_report, usage_table

log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9410
"""Where ``gpupool node-agent`` serves ``/metrics`` unless told otherwise (0 turns it off). Not 9400:
that is the NVIDIA DCGM exporter's, which often runs on the same GPU nodes."""

CARD_LABELS = ("node", "card", "uuid", "model")
REMOTE_CLIENT_LABELS = ("node", "namespace", "pod", "card", "uuid")
"""Labels of the per-remote-client series: the client pod's namespace and name (it runs on another
node), and the card of this node its share is booked on."""


@dataclass(frozen=True)
class CardReport:
    """One card and what the assignments of the pods on this node, and its prepared DRA claims,
    book on it."""

    card: GpuCard
    memory_booked_mib: int
    compute_booked_permille: int
    containers: int
    claims: int = 0
    remote_clients: int = 0
    """Remote clients (pods of other nodes) the node's GPU server serves on the card; their shares
    are in the booked memory and compute."""
    remote_memory_mib: int = 0


def card_reports(node: str, inventory: GpuInventory, pods: Iterable[PodView],
                 claims: Iterable[PodView] = (), remote: Mapping[int, RemoteBooked] | None = None,
                 ) -> tuple[CardReport, ...]:
    """Per card of ``inventory``: memory and compute booked by the assignments of ``pods`` and by the
    prepared DRA ``claims`` (as :meth:`gpupool.nodeagent.dra.claim_state.ClaimState.as_pods` views
    them: the extender books both in one ledger, so the node reports both) and by the ``remote``
    clients the node's GPU server serves on it (:func:`gpupool.nodeagent.remote_usage.remote_booked`:
    the extender books a remote share on the serving node's card), how many app containers hold a
    slice of it and how many claims. Finished pods and assignments for another node count
    nothing; a card the node does not have is not reported (its assignment is refused at Allocate)."""
    memory: defaultdict[int, int] = defaultdict(int)
    compute: defaultdict[int, int] = defaultdict(int)
    holders: dict[bool, defaultdict[int, int]] = {False: defaultdict(int), True: defaultdict(int)}
    for is_claim, pod in [*((False, p) for p in pods), *((True, c) for c in claims)]:
        if pod.terminated or pod.assignment is None:
            continue
        placement = pod.assignment.placement
        if placement.node not in ("", node):
            continue
        for card, (mib, permille, _exclusive) in placement.held_per_card().items():
            memory[card] += mib
            compute[card] += permille
        for assignment in placement.containers:
            if not assignment.init:
                for card in {s.card for s in assignment.slices}:
                    holders[is_claim][card] += 1
    remote = remote or {}
    reports = []
    for c in inventory.cards:
        served = remote.get(c.index, RemoteBooked())
        reports.append(CardReport(c, memory[c.index] + served.memory_mib, compute[c.index] + served.compute_permille,
                                  holders[False][c.index], holders[True][c.index], served.clients,
                                  served.memory_mib))
    return tuple(reports)


CARD_GAUGES: tuple[tuple[str, str, Callable[[CardReport], float]], ...] = (
    ("gpupool_card_memory_total_bytes", "Memory of a card (bytes)", lambda r: r.card.memory_mib * BYTES_PER_MIB),
    ("gpupool_card_memory_allocated_bytes", "Memory gpupool's assignments book on a card (bytes)",
     lambda r: r.memory_booked_mib * BYTES_PER_MIB),
    ("gpupool_card_compute_total_ratio", "Compute of a card gpupool may book, as a fraction of the whole card",
     lambda r: r.card.compute / COMPUTE_PER_CARD),
    ("gpupool_card_compute_allocated_ratio",
     "Compute gpupool's assignments book on a card, as a fraction of the whole card (above 1: over-committed)",
     lambda r: r.compute_booked_permille / COMPUTE_PER_CARD),
    ("gpupool_card_healthy", "1 while the card is healthy", lambda r: float(r.card.healthy)),
    ("gpupool_card_containers", "App containers holding a slice of the card", lambda r: r.containers),
    ("gpupool_card_dra_claims", "Prepared DRA ResourceClaims holding a share of the card", lambda r: r.claims),
    ("gpupool_card_remote_clients", "Remote clients (pods of other nodes) this node's GPU server serves on the card",
     lambda r: r.remote_clients),
    ("gpupool_card_remote_memory_allocated_bytes",
     "Memory remote shares book on the card (bytes; part of gpupool_card_memory_allocated_bytes)",
     lambda r: r.remote_memory_mib * BYTES_PER_MIB),
)
"""Name, help and value of each per-card gauge (labels: :data:`CARD_LABELS`)."""


class NodeAgentCollector(Collector):
    """The agent's cards and counters, computed at scrape time from its current state."""

    def __init__(self, agent: NodeAgent, remote_clients: Path | None = None) -> None:
        self.agent = agent
        self.remote_clients = remote_clients
        """The GPU server's clients file when the agent serves remote shares."""

    def describe(self) -> list[Metric]:
        return []  # collected lazily; nothing to declare up front

    def collect(self) -> Iterator[Metric]:
        agent = self.agent
        claims = agent.prepared_claims()
        remote = remote_client_rows(self.remote_clients, agent.inventory)
        reports = card_reports(agent.node, agent.inventory, agent.listed_pods(), claims, remote_booked(remote))
        for name, documentation, value in CARD_GAUGES:
            family = GaugeMetricFamily(name, documentation, labels=CARD_LABELS)
            for report in reports:
                card = report.card
                family.add_metric([agent.node, str(card.index), card.uuid, card.model], value(report))
            yield family
        yield from remote_client_families(agent.node, remote)
        yield GaugeMetricFamily("gpupool_node_containers_served",
                                "Containers of listed pods whose Allocate this agent answered",
                                value=agent.served_containers())
        answered = CounterMetricFamily("gpupool_node_allocations",
                                       "Allocate calls answered, by the rule that named the container "
                                       "(docs/allocate-mapping.md)", labels=["basis"])
        for basis, count in sorted(agent.stats.bases.items()):
            answered.add_metric([basis], count)
        yield answered
        yield CounterMetricFamily("gpupool_node_allocate_refused", "Allocate calls refused",
                                  value=agent.stats.refused)
        yield CounterMetricFamily("gpupool_node_allocation_mismatches",
                                  "Grants kubelet recorded under another container than the one served",
                                  value=agent.stats.mismatches)
        yield CounterMetricFamily("gpupool_node_pods_released",
                                  "Pods whose grants the agent dropped because kubelet no longer lists them",
                                  value=agent.stats.released_pods)


def remote_client_families(node: str, rows: Sequence[RemoteClientRow]) -> Iterator[Metric]:
    """Per remote client: the memory and compute share booked for it on this node's card, its live
    connections and, while connected, what it uses and since when (labels
    :data:`REMOTE_CLIENT_LABELS`; the card ``-1`` when its uuid is not one of this node's)."""
    memory = GaugeMetricFamily("gpupool_remote_client_memory_limit_bytes",
                               "Memory booked for a remote client on the card (bytes)", labels=REMOTE_CLIENT_LABELS)
    share = GaugeMetricFamily("gpupool_remote_client_compute_share_ratio",
                              "Compute share booked for a remote client on the card (0 to 1; 0: no limit)",
                              labels=REMOTE_CLIENT_LABELS)
    for row in rows:
        labels = [node, row.namespace, row.pod, str(row.card), row.uuid]
        memory.add_metric(labels, float(row.memory_mib * BYTES_PER_MIB))
        share.add_metric(labels, row.compute_percent / 100)
    live = GaugeMetricFamily("gpupool_remote_client_connections",
                             "Live connections of a remote client to this node's GPU server for the card "
                             "(absent while the server has not reported them)", labels=REMOTE_CLIENT_LABELS)
    used = GaugeMetricFamily("gpupool_remote_client_memory_used_bytes",
                             "Device memory a remote client's live allocations hold on the card, all its "
                             "connections together (bytes; absent while not connected)", labels=REMOTE_CLIENT_LABELS)
    sm = GaugeMetricFamily("gpupool_remote_client_sm_utilization_ratio",
                           "SM use of a remote client on the card (0 to 1), where the GPU server measures it "
                           "(--enforce-compute with a compute share; absent otherwise)", labels=REMOTE_CLIENT_LABELS)
    since = GaugeMetricFamily("gpupool_remote_client_connected_since_timestamp_seconds",
                              "When the oldest live connection of a remote client was authenticated (unix seconds; "
                              "absent while not connected)", labels=REMOTE_CLIENT_LABELS)
    for row in rows:
        labels = [node, row.namespace, row.pod, str(row.card), row.uuid]
        if row.connections is not None:
            live.add_metric(labels, float(row.connections))
        if row.memory_used_bytes is not None:
            used.add_metric(labels, float(row.memory_used_bytes))
        if row.sm_percent is not None:
            sm.add_metric(labels, row.sm_percent / 100)
        if row.connected_since is not None:
            since.add_metric(labels, float(row.connected_since))
    yield memory
    yield share
    yield live
    yield used
    yield sm
    yield since


def agent_registry(agent: NodeAgent, extra: Iterable[Collector] = (),
                   remote_clients: Path | None = None) -> CollectorRegistry:
    """Every series the agent exports: its cards and counters, the usage monitor's when it runs, and
    ``extra`` (the risk checks'); ``remote_clients`` is the GPU server's clients file when the agent
    serves remote shares."""
    registry = CollectorRegistry()
    for collector in extra:
        registry.register(collector)
    registry.register(NodeAgentCollector(agent, remote_clients))
    registry.register(IsolationCollector(agent))
    if agent.monitor is not None:
        registry.register(UsageCollector(agent, agent.monitor))
    return registry


def metrics_app(agent: NodeAgent, extra: Iterable[Collector] = (),
                remote_clients: Path | None = None) -> web.Application:
    """An aiohttp application serving ``GET /metrics`` and, with the usage monitor, ``GET /usage``
    (a plain-text table per card and per container) and ``GET /usage.json`` (the same for programs,
    :mod:`gpupool.api.usage_report`; the kubectl plugin reads it through the API server's node proxy).
    With ``remote_clients`` (the GPU server's clients file) ``/usage`` ends with the remote clients."""
    registry = agent_registry(agent, extra, remote_clients)

    async def scrape(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def usage(_request: web.Request) -> web.Response:
        if agent.monitor is None:
            return web.Response(status=404, text="the usage monitor is off (--no-usage-monitor)\n")
        return web.Response(text=usage_table(agent.node, agent.monitor, agent.inventory, agent.listed_pods(),
                                             agent.prepared_claims())
                            + isolation_table(agent)
                            + remote_table(remote_client_rows(remote_clients, agent.inventory)))

    async def usage_json(_request: web.Request) -> web.Response:
        if agent.monitor is None:
            return web.json_response({"error": "the usage monitor is off (--no-usage-monitor)"}, status=404)
        report = usage_report(agent.node, agent.monitor, agent.inventory, agent.listed_pods(),
                              container_heartbeats(agent.enforcement),
                              remote_client_rows(remote_clients, agent.inventory), agent.prepared_claims())
        return web.Response(text=encode_usage_report(report), content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/usage", usage)
    app.router.add_get(f"/{USAGE_REPORT_PATH}", usage_json)
    return app


async def serve_metrics(agent: NodeAgent, port: int, host: str = "0.0.0.0",
                        extra: Iterable[Collector] = (), limits: ServerLimits | None = None,
                        remote_clients: Path | None = None) -> web.AppRunner | None:
    """Serve ``/metrics`` on ``host:port`` from the running loop; the runner to clean up, or None.

    A port that cannot be bound is logged and the agent goes on without metrics: the device plugin
    is what the node's pods need, the metrics are not worth a crash loop. ``limits``: its connection
    cap and timeouts (docs/security.md, "Bounded servers").
    """
    limits = limits or ServerLimits()
    runner = bounded_runner(metrics_app(agent, extra, remote_clients), limits, access_log=None)
    await runner.setup()
    try:
        await BoundedSite(runner, host, port, limits, name="the metrics port").start()
    except OSError as exc:
        log.error("metrics not served: cannot listen on %s:%d: %s", host, port, exc)
        await runner.cleanup()
        return None
    log.info("metrics on http://%s:%d/metrics", host, port)
    return runner
