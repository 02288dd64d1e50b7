"""Where ``kubectl gpupool inspect`` gets what a card is actually doing, as opposed to what is booked.

Why a port: the booking comes from the API's objects, the use from each node agent's usage monitor
(:mod:`gpupool.kubectl.agent_usage` reads it through the API server's node proxy). The views ask a
:class:`UsageSource` per card and per node, so the table and the JSON keep their shape whether
usage is read, switched off (:class:`NoUsage`) or unreachable on some nodes (``-`` and a note).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Protocol

NOT_PUBLISHED = "-"
"""What the usage column shows for a card nobody reports on."""


@dataclass(frozen=True)
class CardUsageSample:
    """One card's measured use: SM utilisation in percent and device memory in use."""

    utilisation_pct: float
    memory_used_mib: int

    def shown(self) -> str:
        """The table cell, e.g. ``37% 5120MiB``."""
        return f"{self.utilisation_pct:.0f}% {self.memory_used_mib}MiB"


@dataclass(frozen=True)
class RemoteClientLive:
    """A remote share as the serving node's GPU server reports it (``remoteClients`` of the agent's
    report): whether the server knows the client, its live connections, and the limits it holds it to.

    Why not only a count: a booked share the server does not list (its clients file not yet
    rewritten, or an agent too old to report remote clients) and a listed one with no connection
    are different problems, and both differ from a node whose report could not be read at all
    (then the view has no :class:`RemoteClientLive`, and the node's usage note says why)."""

    listed: bool
    connections: int | None = None
    """Live authenticated connections; None while the server has not reported them."""
    memory_limit_mib: int | None = None
    compute_share_percent: int | None = None
    memory_used_mib: int | None = None
    """What the client's allocations hold on the card now; None: not reported (not connected, or an
    older agent or server)."""
    sm_percent: int | None = None
    """Its SM use, where the server measures it (None: not measured)."""
    connected_since: dt.datetime | None = None
    """When its oldest live connection was authenticated (None: not reported)."""

    def shown(self) -> str:
        """The holder's suffix: ``connected (2 connections) since 2027-01-15T08:00:00Z, 1536MiB used,
        40% SM``, ``booked, not connected``, ... (a figure the server did not report is left out)."""
        if not self.listed:
            return "not in the node agent's report"
        if self.connections is None:
            return "connections not reported"
        if self.connections == 0:
            return "booked, not connected"
        text = f"connected ({self.connections} connection{'s' if self.connections != 1 else ''})"
        if self.connected_since is not None:
            text += f" since {self.connected_since.astimezone(dt.UTC):%Y-%m-%dT%H:%M:%SZ}"
        if self.memory_used_mib is not None:
            text += f", {self.memory_used_mib}MiB used"
        if self.sm_percent is not None:
            text += f", {self.sm_percent}% SM"
        return text


class UsageSource(Protocol):
    """Answers the measured use of one card of one node, or None when nobody reports it."""

    def card_usage(self, node: str, uuid: str) -> CardUsageSample | None:
        """The latest sample for card ``uuid`` of ``node``."""

    def node_note(self, node: str) -> str | None:
        """Why ``node``'s usage is unknown (its agent unreachable, its monitor off), or None."""

    def remote_client(self, node: str, pod: str, uuid: str) -> RemoteClientLive | None:
        """Pod ``namespace/name``'s remote share on card ``uuid`` as ``node``'s GPU server reports it;
        None when ``node``'s report was not read."""


class NoUsage:
    """The usage source when usage is not asked for: every card unknown, no notes."""

    def card_usage(self, node: str, uuid: str) -> CardUsageSample | None:
        """Always None."""
        return None

    def node_note(self, node: str) -> str | None:
        """Always None (not asking is no problem of the node)."""
        return None

    def remote_client(self, node: str, pod: str, uuid: str) -> RemoteClientLive | None:
        """Always None (no report read)."""
        return None


def usage_cell(sample: CardUsageSample | None) -> str:
    """The usage column's text for one card."""
    return sample.shown() if sample is not None else NOT_PUBLISHED
