"""The agent's lending flags (a light module: the command line imports it before anything starts)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpupool.api.lending import DEFAULT_CHECKPOINT_DEADLINE_S, DEFAULT_HIGH_PRIORITY_THRESHOLD
from gpupool.nodeagent.lending.cuda_suspend import DEFAULT_CUDA_CHECKPOINT_TIMEOUT_S

DEFAULT_CRIU_TOOLS_DIR = "/run/gpupool/criu"

DEFAULT_CHECKPOINT_ROOT = "/var/lib/gpupool/checkpoint"
DEFAULT_CHECKPOINT_RETENTION = "7d"
DEFAULT_CHECKPOINT_RETENTION_S = 7 * 86400.0
_RETENTION = re.compile(r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")
_SECONDS_PER = (86400.0, 3600.0, 60.0, 1.0)
DEFAULT_ACTIVE_PERCENT = 10
DEFAULT_ACTIVE_MEMORY_MIB = 256
DEFAULT_ACTIVE_SAMPLES = 3


def parse_retention(value: str) -> float:
    """Seconds from ``--checkpoint-retention``: a number of seconds or e.g. ``7d``, ``12h``, ``1d12h``."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        match = _RETENTION.match(text)
        if not match or not any(match.groups()):
            raise ValueError(f"not a duration: {value!r} (use seconds or e.g. 7d, 12h, 1d12h)") from None
        seconds = sum(float(g) * unit for g, unit in zip(match.groups(), _SECONDS_PER, strict=True) if g)
    if seconds < 0 or seconds != seconds:
        raise ValueError(f"not a duration: {value!r}")
    return seconds


@dataclass(frozen=True)
class ActivityThresholds:
    """``--owner-active-percent``, ``--owner-active-memory``, ``--owner-active-samples``: when a lent card's
    owner counts as computing again (:mod:`gpupool.nodeagent.lending.owner_activity`)."""

    percent: int = DEFAULT_ACTIVE_PERCENT
    memory_mib: int = DEFAULT_ACTIVE_MEMORY_MIB
    samples: int = DEFAULT_ACTIVE_SAMPLES

    def __post_init__(self) -> None:
        if not 1 <= self.percent <= 100:
            raise ValueError(f"owner activity: percent {self.percent} is not within 1..100")
        if self.memory_mib < 1 or self.samples < 1:
            raise ValueError(f"owner activity: memory {self.memory_mib} MiB and samples {self.samples} must be >= 1")


@dataclass(frozen=True)
class LendingOptions:
    """``--checkpoint-dir``, ``--checkpoint-deadline``, ``--high-priority-threshold``, the owner-activity
    thresholds, ``--cuda-checkpoint-timeout`` (0: never run the tool), where the interception
    library's regions are (``--state-dir``; ``None``: not read), ``--criu`` and ``--checkpoint-retention``."""

    checkpoint_root: str = DEFAULT_CHECKPOINT_ROOT
    deadline_s: float = DEFAULT_CHECKPOINT_DEADLINE_S
    threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD
    activity: ActivityThresholds = field(default_factory=ActivityThresholds)
    cuda_checkpoint_timeout_s: float = DEFAULT_CUDA_CHECKPOINT_TIMEOUT_S
    shim_state_dir: str | None = None
    criu: str | None = None
    """``--criu``: a static CRIU for pods annotated ``checkpoint: process`` (``None``: no process checkpoints)."""
    criu_tools_dir: str = DEFAULT_CRIU_TOOLS_DIR
    """The host directory (a tmpfs, for CRIU's kernel cache) those pods get CRIU and ``criu-run`` from."""
    checkpoint_retention_s: float = DEFAULT_CHECKPOINT_RETENTION_S
    """``--checkpoint-retention``: a task directory idle this long is removed (0: never;
    :mod:`~gpupool.nodeagent.lending.checkpoint_retention`)."""
