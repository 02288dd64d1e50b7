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


class UsageSource(Protocol):
    """Answers the measured use of one card of one node, or None when nobody reports it."""

    def card_usage(self, node: str, uuid: str) -> CardUsageSample | None:
        """The latest sample for card ``uuid`` of ``node``."""

    def node_note(self, node: str) -> str | None:
        """Why ``node``'s usage is unknown (its agent unreachable, its monitor off), or None."""


class NoUsage:
    """The usage source when usage is not asked for: every card unknown, no notes."""

    def card_usage(self, node: str, uuid: str) -> CardUsageSample | None:
        """Always None."""
        return None

    def node_note(self, node: str) -> str | None:
        """Always None (not asking is no problem of the node)."""
        return None


def usage_cell(sample: CardUsageSample | None) -> str:
    """The usage column's text for one card."""
    return sample.shown() if sample is not None else NOT_PUBLISHED
