"""``kubectl gpupool inspect``: per node and per card, what is booked, by whom, and what is used.

The views are frozen dataclasses read from a :class:`ClusterSnapshot`; the table and the JSON are
two renderings of the same views, so a script and a person see the same numbers. Compute is shown
in percent of a card (the ledger keeps per-mille), memory in MiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpupool.api.fields import format_time
from gpupool.core.model import CardMode
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.kubectl.snapshot import ClusterSnapshot
from gpupool.kubectl.table import render_table
from gpupool.kubectl.usage import CardUsageSample, RemoteClientLive, UsageSource, usage_cell

PERMILLE_PER_PERCENT = 10
NO_CARD = "-"
"""Card columns of a node without cards, and the holder column of a card nobody holds."""

HEADERS = ("NODE", "CARD", "MODEL", "HEALTH", "MODE", "MEMORY(MiB)", "COMPUTE", "USAGE", "HOLDERS")


@dataclass(frozen=True)
class HolderView:
    """One container's slice of one card. ``unbound``: held by an assignment whose bind is in flight."""

    pod: str
    container: str
    memory_mib: int
    compute: int
    exclusive: bool
    init: bool = False
    unbound: bool = False
    remote_from: str | None = None
    """A remote share (docs/remote-gpu.md): the node the pod runs on and reaches this card from over
    the network ("" before its bind); None for a pod on this card's own node."""
    remote_live: RemoteClientLive | None = None
    """For a remote share, its live state as this card's node's GPU server reports it; None when not a
    remote share or when that node's report was not read."""
    used_by: tuple[str, ...] = ()
    """For a DRA claim, the containers that got their share through it (``namespace/pod/container``,
    or ``namespace/pod`` for a reserved pod none of whose containers names it)."""

    def shown(self) -> str:
        """``namespace/pod/container (2048MiB, 30%)``, ``(whole card)`` for an exclusive holder,
        ``namespace/claim:name (...) used by namespace/pod/container`` for a DRA claim (booked as one
        container named after it; ``used by`` once a pod it is reserved for is read);
        ``remote from NODE`` for a pod using the card over the network from another node, followed by
        its live state where the server's node agent reported (``, connected (2 connections)``)."""
        share = "whole card" if self.exclusive else f"{self.memory_mib}MiB, {percent(self.compute)}"
        remote = None if self.remote_from is None else f" remote from {self.remote_from or '(not bound yet)'}"
        if remote is not None and self.remote_live is not None:
            remote += f", {self.remote_live.shown()}"
        users = f" used by {', '.join(self.used_by)}" if self.used_by else ""
        marks = "".join((" init" if self.init else "", " binding" if self.unbound else "", remote or "", users))
        holder = self.pod if self.container == self.pod else f"{self.pod}/{self.container}"  # a DRA claim
        return f"{holder} ({share}){marks}"


@dataclass(frozen=True)
class CardView:
    """One card: what it is, what is booked on it out of its total, and who holds it."""

    index: int
    uuid: str
    model: str
    healthy: bool
    mode: CardMode
    memory_booked: int
    memory_total: int
    compute_booked: int
    compute_total: int
    over_committed: bool
    holders: tuple[HolderView, ...]
    usage: CardUsageSample | None


@dataclass(frozen=True)
class NodeView:
    """One node: its CPU and memory booked out of allocatable, its cards, why it takes no GPU pod, and
    why its usage is unknown."""

    name: str
    cpu_booked: int
    cpu_total: int
    memory_booked: int
    memory_total: int
    cards: tuple[CardView, ...]
    problem: str | None
    usage_note: str | None = None
    enforcement_note: str | None = None
    """Set where the node does not enforce its GPU shares: what it says (None: enforcing, or no notice)."""
    checks_note: str | None = None
    """The agent's start-up checks' summary where any was not ok (None: all ok, or none written):
    shown only then, like the other notes, so a healthy node adds no line."""


def percent(compute: int) -> str:
    """Per-mille of a card as a percentage (``300`` → ``30%``)."""
    return f"{compute / PERMILLE_PER_PERCENT:g}%"


def node_views(snapshot: ClusterSnapshot, usage: UsageSource, only: str | None = None) -> list[NodeView]:
    """Every present node of the snapshot (or just ``only``), by name."""
    state = snapshot.state
    views = []
    for row, spec in enumerate(state.specs):
        if not state.present[row] or (only is not None and spec.name != only):
            continue
        holders = _holders(snapshot, row, usage)
        over = set(state.over_capacity(spec.name))
        cards = tuple(
            CardView(index=card.index, uuid=card.uuid, model=card.model, healthy=use.healthy, mode=use.mode,
                     memory_booked=use.memory_total - use.memory_free, memory_total=use.memory_total,
                     compute_booked=use.compute_total - use.compute_free, compute_total=use.compute_total,
                     over_committed=pos in over, holders=tuple(holders.get(pos, ())),
                     usage=usage.card_usage(spec.name, card.uuid))
            for pos, (card, use) in enumerate(zip(spec.cards, state.card_usage(spec.name), strict=True)))
        views.append(NodeView(name=spec.name, cpu_booked=spec.cpu_milli - int(state.cpu_free[row]),
                              cpu_total=spec.cpu_milli, memory_booked=spec.memory_mib - int(state.mem_free[row]),
                              memory_total=spec.memory_mib, cards=cards, problem=snapshot.node_problems.get(spec.name),
                              usage_note=usage.node_note(spec.name) if cards else None,
                              enforcement_note=snapshot.enforcement.get(spec.name),
                              checks_note=snapshot.agent_checks.get(spec.name)))
    return sorted(views, key=lambda v: v.name)


def _holders(snapshot: ClusterSnapshot, row: int, usage: UsageSource) -> dict[int, list[HolderView]]:
    """Per card position of node ``row``, the containers holding a slice of it (by pod, then container);
    a remote share carries its live state from this node's report (the GPU server runs here)."""
    state = snapshot.state
    spec = state.specs[row]
    found: dict[int, list[HolderView]] = {}
    for key in sorted(state.pods_on.get(row, ())):
        remote_from = snapshot.remote.get(key)
        for assigned in state.placements[key].containers:
            for piece in assigned.slices:
                live = None
                if remote_from is not None and 0 <= piece.card < len(spec.cards):
                    live = usage.remote_client(spec.name, key, spec.cards[piece.card].uuid)
                found.setdefault(piece.card, []).append(HolderView(
                    pod=key, container=assigned.container, memory_mib=piece.memory_mib, compute=piece.compute,
                    exclusive=piece.exclusive, init=assigned.init, unbound=key in snapshot.unbound,
                    remote_from=remote_from, remote_live=live, used_by=snapshot.claim_users.get(key, ())))
    return found


# ------------------------------------------------------------------------------------- rendering
def _health(card: CardView) -> str:
    if card.over_committed:
        return "over-committed"
    return "healthy" if card.healthy else "unhealthy"


def inspect_table(views: list[NodeView]) -> str:
    """The human table: one row per card, one more per further holder; node problems below it."""
    rows: list[list[str]] = []
    for node in views:
        if not node.cards:
            rows.append([node.name, *([NO_CARD] * (len(HEADERS) - 1))])
        for card in node.cards:
            holders = [h.shown() for h in card.holders] or [NO_CARD]
            rows.append([node.name, str(card.index), card.model, _health(card), card.mode.name.lower(),
                         f"{card.memory_booked}/{card.memory_total}",
                         f"{percent(card.compute_booked)}/{percent(card.compute_total)}",
                         usage_cell(card.usage), holders[0]])
            rows.extend([""] * (len(HEADERS) - 1) + [more] for more in holders[1:])
    if not rows:
        return "No nodes found."
    notes = [f"node {node.name}: {note}" for node in views
             for note in (node.problem, _enforcement_line(node), _checks_line(node), node.usage_note) if note]
    return "\n".join([render_table(HEADERS, rows), *notes])


def _enforcement_line(node: NodeView) -> str | None:
    return f"GPU shares: {node.enforcement_note}" if node.enforcement_note else None


def _checks_line(node: NodeView) -> str | None:
    return f"agent start-up checks: {node.checks_note}" if node.checks_note else None


def inspect_json(views: list[NodeView], pod_problems: dict[str, str] | None = None) -> dict[str, Any]:
    """The same views for scripts (``-o json``); ``usage`` is null where nothing publishes it, and the
    node's ``usageNote`` says why; ``agentChecks`` is the agent's start-up checks' summary where
    any was not ok, else null."""
    return {
        "nodes": [
            {"name": node.name, "problem": node.problem, "usageNote": node.usage_note,
             "enforcementNote": node.enforcement_note, "agentChecks": node.checks_note,
             "cpuMilli": {"booked": node.cpu_booked, "total": node.cpu_total},
             "memoryMiB": {"booked": node.memory_booked, "total": node.memory_total},
             "cards": [_card_json(card) for card in node.cards]}
            for node in views
        ],
        "podProblems": dict(sorted((pod_problems or {}).items())),
        "computeUnit": f"per-mille of a card ({COMPUTE_PER_CARD} = whole card)",
    }


def _card_json(card: CardView) -> dict[str, Any]:
    return {
        "index": card.index, "uuid": card.uuid, "model": card.model, "healthy": card.healthy,
        "mode": card.mode.name.lower(), "overCommitted": card.over_committed,
        "memoryMiB": {"booked": card.memory_booked, "total": card.memory_total},
        "computeMilli": {"booked": card.compute_booked, "total": card.compute_total},
        "usage": None if card.usage is None else {"utilisationPercent": card.usage.utilisation_pct,
                                                   "memoryUsedMiB": card.usage.memory_used_mib},
        "holders": [{"pod": h.pod, "container": h.container, "init": h.init, "memoryMiB": h.memory_mib,
                     "computeMilli": h.compute, "exclusive": h.exclusive, "binding": h.unbound,
                     "remoteFrom": h.remote_from, "remoteLive": _remote_json(h.remote_live),
                     "usedBy": list(h.used_by)}
                    for h in card.holders],
    }


def _remote_json(live: RemoteClientLive | None) -> dict[str, Any] | None:
    if live is None:
        return None
    return {"listed": live.listed, "connections": live.connections, "memoryLimitMiB": live.memory_limit_mib,
            "computeSharePercent": live.compute_share_percent, "memoryUsedMiB": live.memory_used_mib,
            "smPercent": live.sm_percent,
            "connectedSince": None if live.connected_since is None else format_time(live.connected_since)}
