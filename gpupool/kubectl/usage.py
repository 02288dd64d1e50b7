"""Where ``kubectl gpupool inspect`` gets what a card is actually doing, as opposed to what is booked.

Why a port: the booking comes from the API's objects, the use from each node agent's usage monitor
(:mod:`gpupool.kubectl.agent_usage` reads it through the API server's node proxy). The views ask a
:class:`UsageSource` per card and per node, so the table and the JSON keep their shape whether
usage is read, switched off (:class:`NoUsage`) or unreachable on some nodes (``-`` and a note).
"""

from __future__ import annotations

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

    def shown(self) -> str:
        """The holder's suffix: ``connected (2 connections)``, ``booked, not connected``, ..."""
        if not self.listed:
            return "not in the node agent's report"
        if self.connections is None:
            return "connections not reported"
        if self.connections == 0:
            return "booked, not connected"
        return f"connected ({self.connections} connection{'s' if self.connections != 1 else ''})"


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
