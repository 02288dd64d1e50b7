"""When a pod's GPUs sit idle: the model behind the lending replay.

A GPU pod alternates busy and idle periods while it runs (an alternating renewal process: both
lengths exponential, the idle share sets their ratio). The node agent calls a card idle only after it
saw no SM activity for the idle time (the usage monitor's rule, default 10 minutes), so a pod lends
only the part of each idle period beyond that threshold, and only until its next busy period starts.

The defaults and where they come from are in docs/lending.md ("The idle model"): public traces of
GPU clusters put the idle share of held GPUs between a quarter and well over half, and the
experiment prints the gain for idle shares from 10 % to 50 %.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_IDLE_SHARE = 0.5
"""Share of a GPU pod's running time spent idle (the reasoning is in docs/lending.md, "The idle model")."""

DEFAULT_MEAN_IDLE_MINUTES = 60.0
"""Mean length of one idle period."""

DEFAULT_IDLE_THRESHOLD_MINUTES = 10.0
"""The usage monitor's idle rule: no SM activity for this long makes a card idle (and lendable)."""


@dataclass(frozen=True)
class IdleModel:
    """Parameters of the busy/idle alternation of one GPU pod."""

    idle_share: float = DEFAULT_IDLE_SHARE
    mean_idle_minutes: float = DEFAULT_MEAN_IDLE_MINUTES
    threshold_minutes: float = DEFAULT_IDLE_THRESHOLD_MINUTES

    def __post_init__(self) -> None:
        if not 0.0 <= self.idle_share < 1.0:
            raise ValueError(f"idle share must be in [0, 1), got {self.idle_share}")
        if self.mean_idle_minutes <= 0:
            raise ValueError(f"mean idle period must be positive, got {self.mean_idle_minutes} min")
        if self.threshold_minutes < 0:
            raise ValueError(f"idle threshold must be non-negative, got {self.threshold_minutes} min")

    @property
    def mean_busy_minutes(self) -> float:
        """Busy periods long enough that idle time is ``idle_share`` of the whole, on average."""
        return self.mean_idle_minutes * (1.0 - self.idle_share) / self.idle_share

    def lendable_windows(self, duration_s: float, rng: np.random.Generator) -> tuple[tuple[float, float], ...]:
        """Windows (start, end) in seconds after the pod started in which its GPUs can be lent.

        A pod starts busy (it was just scheduled to do work). Each idle period lends from its start
        plus the threshold to its end; periods shorter than the threshold lend nothing.
        """
        if self.idle_share == 0.0:
            return ()
        busy_mean = self.mean_busy_minutes * 60.0
        idle_mean = self.mean_idle_minutes * 60.0
        threshold = self.threshold_minutes * 60.0
        windows: list[tuple[float, float]] = []
        now = float(rng.exponential(busy_mean))
        while now < duration_s:
            idle_end = min(duration_s, now + float(rng.exponential(idle_mean)))
            if idle_end - now > threshold:
                windows.append((now + threshold, idle_end))
            now = idle_end + float(rng.exponential(busy_mean))
        return tuple(windows)
