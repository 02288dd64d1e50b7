"""Usage as each node agent publishes it, read through the API server's node proxy.

Why the node proxy: the plugin has nothing but a kubeconfig, and a user's machine usually cannot
reach the nodes' addresses; the API server can, and ``GET /api/v1/nodes/<node>:<port>/proxy/usage.json``
forwards to the agent's metrics port at the node's address (RBAC: ``get`` on ``nodes/proxy``). The
JSON report (:mod:`gpupool.api.usage_report`) spares the plugin parsing the ``/usage`` table.

An agent that does not answer costs at most the timeout, and nodes are asked in parallel, so a
cluster with some dead agents still prints in about one timeout; each such node shows ``-`` and a
note saying why, and nothing raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from gpupool.api.fields import AnnotationError
from gpupool.api.usage_report import USAGE_REPORT_PATH, NodeUsageReport, decode_usage_report
from gpupool.kubectl.connection import ClusterAccessError
from gpupool.kubectl.usage import CardUsageSample, RemoteClientLive

DEFAULT_AGENT_PORT = 9410
"""The node agent's metrics port (its ``--metrics-port`` default, the DaemonSet's hostPort) unless it
runs with another."""
AGENT_TIMEOUT_S = 3.0
"""Per node: the API server's dial plus the agent's answer; a report is a few kB."""
PARALLEL_NODES = 16
"""Nodes asked at once."""

ReadProxy = Callable[[str, int, str, float], str]
"""(node, port, path, timeout seconds) → the body; raises :class:`ClusterAccessError` saying why not."""


class AgentUsage:
    """The usage source of ``inspect``: one report per node, fetched by :meth:`fetch` before the views ask."""

    def __init__(self, read: ReadProxy, port: int = DEFAULT_AGENT_PORT, timeout_s: float = AGENT_TIMEOUT_S) -> None:
        self._read = read
        self._port = port
        self._timeout_s = timeout_s
        self._reports: dict[str, dict[str, CardUsageSample | None]] = {}
        self._notes: dict[str, str] = {}
        self._remote: dict[str, dict[tuple[str, str], RemoteClientLive]] = {}

    def fetch(self, nodes: Iterable[str]) -> None:
        """Ask every node's agent (in parallel); failures become notes, never exceptions."""
        wanted = sorted(set(nodes))
        if not wanted:
            return
        with ThreadPoolExecutor(max_workers=min(PARALLEL_NODES, len(wanted))) as pool:
            for node, outcome in zip(wanted, pool.map(self._ask, wanted), strict=True):
                if isinstance(outcome, str):
                    self._notes[node] = outcome
                else:
                    self._reports[node] = {card.uuid: _sample(card.utilization_percent, card.memory_used_mib)
                                           for card in outcome.cards}
                    self._remote[node] = {
                        (f"{r.namespace}/{r.pod}", r.uuid): RemoteClientLive(
                            True, r.connections, r.memory_limit_mib, r.compute_share_percent,
                            memory_used_mib=r.memory_used_mib, sm_percent=r.sm_percent,
                            connected_since=r.connected_since)
                        for r in outcome.remote_clients}

    def _ask(self, node: str) -> NodeUsageReport | str:
        where = f"usage not read from the node agent (port {self._port})"
        try:
            body = self._read(node, self._port, USAGE_REPORT_PATH, self._timeout_s)
        except (ClusterAccessError, OSError) as exc:
            return f"{where}: {exc}"
        try:
            report = decode_usage_report(body)
        except AnnotationError as exc:
            return f"{where}: {exc}"
        if report.node != node:
            return f"{where}: the agent there reports for node {report.node!r}"
        return report

    def card_usage(self, node: str, uuid: str) -> CardUsageSample | None:
        """The card's sample from its node's report; None when the node or the card is not reported."""
        return self._reports.get(node, {}).get(uuid)

    def node_note(self, node: str) -> str | None:
        """Why the node's usage is unknown, when it is."""
        return self._notes.get(node)

    def remote_client(self, node: str, pod: str, uuid: str) -> RemoteClientLive | None:
        """The share as ``node``'s report lists it under ``remoteClients``; unlisted (a report without
        the field, from an older agent or a node serving nobody, lists nobody) when the report does not
        name it; None when the report was not read."""
        if node not in self._reports:
            return None
        return self._remote.get(node, {}).get((pod, uuid), RemoteClientLive(listed=False))


def _sample(utilization: int | None, memory: int | None) -> CardUsageSample | None:
    if utilization is None or memory is None:
        return None  # the agent's last sample lacked the card: unknown, not 0
    return CardUsageSample(utilisation_pct=float(utilization), memory_used_mib=memory)
