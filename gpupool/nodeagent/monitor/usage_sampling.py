"""The usage-sampling port: per card utilisation and memory, per process memory and SM use.

The real implementation will ask NVML (``nvmlDeviceGetUtilizationRates``,
``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetComputeRunningProcesses``,
``nvmlDeviceGetProcessUtilization``); :mod:`gpupool.nodeagent.monitor.scripted_usage` replays a
script so tests cover a day in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ProcessUsage:
    """One process on one card: memory it holds, and its SM utilisation when the driver reports it."""

    pid: int
    memory_used_mib: int
    sm_percent: int | None = None


@dataclass(frozen=True)
class CardUsage:
    """One card at one instant."""

    index: int
    utilization_percent: int
    memory_used_mib: int
    memory_total_mib: int
    processes: tuple[ProcessUsage, ...] = ()


@dataclass(frozen=True)
class UsageSample:
    """Every card of the node at wall-clock ``time``."""

    time: float
    cards: tuple[CardUsage, ...]

    def card(self, index: int) -> CardUsage | None:
        """The card with this index, if sampled."""
        for card in self.cards:
            if card.index == index:
                return card
        return None


class UsageSampler(Protocol):
    """Takes one sample of the node's cards."""

    def sample(self) -> UsageSample:
        """The cards now; raises ``OSError``-like errors the caller logs and retries."""
        ...
