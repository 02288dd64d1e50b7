"""The agent's lending flags (a light module: the command line imports it before anything starts)."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.api.lending import DEFAULT_CHECKPOINT_DEADLINE_S, DEFAULT_HIGH_PRIORITY_THRESHOLD

DEFAULT_CHECKPOINT_ROOT = "/var/lib/gpupool/checkpoint"


@dataclass(frozen=True)
class LendingOptions:
    """``--checkpoint-dir``, ``--checkpoint-deadline``, ``--high-priority-threshold``."""

    checkpoint_root: str = DEFAULT_CHECKPOINT_ROOT
    deadline_s: float = DEFAULT_CHECKPOINT_DEADLINE_S
    threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD
