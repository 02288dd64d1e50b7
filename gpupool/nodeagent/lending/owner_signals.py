"""What one owner container is doing on one lent card, per sample, from the two per-container sources.

Busy samples of the whole card cannot tell an owner from its borrower (both compute on it), so the
lending side reads signals that belong to one container:

* the interception library's region of the container (``<state>/containers/<pod-uid>_<container>/
  memory.region``, read with :func:`gpupool.shim.region.read_region`): per CUDA ordinal of the
  container, ``util_container_percent`` (the container's own SM use, which the library's compute
  controller measures through NVML's per-process utilisation) and ``used_bytes`` (what the
  container's processes allocated);
* NVML's per-process accounting in the monitor's last sample: SM use and memory of the processes on
  the card whose host pid is a holder of the card from that container.

Nothing here raises on bad input: a region that is missing, unreadable, of another layout version,
or whose numbers cannot be true (above 100 %, more memory than the card has) gives no signal, and
the reason is logged once per file; a missing signal never counts as activity.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from gpupool.nodeagent.monitor.usage_sampling import CardUsage
from gpupool.shim.region import RegionSnapshot, read_region

log = logging.getLogger(__name__)

MIB = 1024 * 1024
FULL_PERCENT = 100
_REPORTED_LIMIT = 10_000  # forget what was logged past this many files (a long-lived agent's memory)


class Source(StrEnum):
    """Where a signal comes from."""

    REGION = "region"
    NVML = "nvml"


@dataclass(frozen=True)
class Signal:
    """One source's reading of one container on one card; ``None``: the source does not say."""

    source: Source
    compute_percent: int | None
    memory_mib: int | None


RegionRead = Callable[[Path], RegionSnapshot]


class RegionSignals:
    """Reads a container's region and picks one card out of it; logs each distinct problem once."""

    def __init__(self, read: RegionRead = read_region) -> None:
        self._read = read
        self._reported: set[tuple[str, str]] = set()

    def signal(self, path: Path, ordinal: int, card_total_mib: int | None) -> Signal | None:
        """The card at CUDA ordinal ``ordinal`` of the region at ``path``, or ``None`` when it cannot say."""
        try:
            region = self._read(path)
        except FileNotFoundError:
            return None  # no library in the container, or it has not run a CUDA call yet: normal
        except (OSError, ValueError) as exc:  # RegionFormatError is a ValueError
            self._report(path, type(exc).__name__, f"region {path}: unreadable ({exc}); it gives no signal")
            return None
        if not 0 <= ordinal < len(region.devices):
            self._report(path, "ordinal", f"region {path}: no card at ordinal {ordinal}; it gives no signal")
            return None
        device = region.devices[ordinal]
        used_mib = device.used_bytes // MIB
        if device.util_container_percent > FULL_PERCENT or (card_total_mib is not None and used_mib > card_total_mib):
            self._report(path, "values", f"region {path}: card {ordinal} reports {device.util_container_percent} % "
                                         f"and {used_mib} MiB, which cannot be true; it gives no signal")
            return None
        return Signal(Source.REGION, device.util_container_percent, used_mib)

    def _report(self, path: Path, what: str, message: str) -> None:
        key = (str(path), what)
        if key in self._reported:
            return
        if len(self._reported) >= _REPORTED_LIMIT:
            self._reported.clear()
        self._reported.add(key)
        log.warning("%s", message)


def nvml_signal(card: CardUsage | None, pids: Iterable[int]) -> Signal | None:
    """The processes ``pids`` on ``card`` as NVML listed them: summed SM use (``None`` when the driver
    gave none of them one) and memory; ``None`` when none of them is listed."""
    if card is None:
        return None
    wanted = set(pids)
    mine = [p for p in card.processes if p.pid in wanted]
    if not mine:
        return None
    shares = [p.sm_percent for p in mine if p.sm_percent is not None]
    return Signal(Source.NVML, sum(shares) if shares else None, sum(p.memory_used_mib for p in mine))
