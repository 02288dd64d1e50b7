"""Where ``kubectl gpupool inspect`` gets what a card is actually doing, as opposed to what is booked.

Why a port: nothing publishes usage to the API yet. The node agent's usage monitor will; the
plugin then reads it through a :class:`UsageSource` (a node annotation, or the agent's ``/usage``
endpoint through the API server's node proxy) without the table or the JSON changing shape. Until
then :class:`NoUsage` answers every card with None and the column shows ``-``.
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


class NoUsage:
    """The usage source while no component publishes usage: every card unknown."""

    def card_usage(self, node: str, uuid: str) -> CardUsageSample | None:
        """Always None (nothing publishes usage yet)."""
        return None


def usage_cell(sample: CardUsageSample | None) -> str:
    """The usage column's text for one card."""
    return sample.shown() if sample is not None else NOT_PUBLISHED
