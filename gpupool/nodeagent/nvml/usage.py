"""Usage samples from NVML: per card utilisation and memory, per process memory and SM share.

Calls: ``nvmlDeviceGetUtilizationRates`` (``.gpu``: percent of the last sample period in which a
kernel ran), ``nvmlDeviceGetMemoryInfo`` (``.used``/``.total``, bytes),
``nvmlDeviceGetComputeRunningProcesses`` (``pid``, ``usedGpuMemory`` in bytes, ``None`` where the
driver hides it) and ``nvmlDeviceGetProcessUtilization`` (per-process ``smUtil`` since a timestamp;
NVML_ERROR_NOT_FOUND when no process ran a kernel since then).

Errors, and why each is handled as it is: a card whose utilisation or memory cannot be read is left
out of the sample, so the idle rule counts it as active (not knowing must not make a card idle and
lendable); a failing process query leaves the card's processes empty or without SM shares, and the
card-level utilisation still decides activity. Each distinct failure is logged once per card.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpupool.nodeagent.monitor.usage_sampling import CardUsage, ProcessUsage, UsageSample

log = logging.getLogger(__name__)

MIB = 1024 * 1024
#: How far back the first per-process utilisation query looks (NVML keeps a few seconds).
FIRST_LOOKBACK_US = 5_000_000


class NvmlUsageSampler:
    """A :class:`~gpupool.nodeagent.monitor.usage_sampling.UsageSampler` over an initialised NVML."""

    def __init__(self, nvml: Any, handles: Callable[[], Sequence[Any]],
                 clock: Callable[[], float] = time.time) -> None:
        self._nvml = nvml
        self._handles = handles
        self._clock = clock
        self._last_seen_us: dict[int, int] = {}
        self._reported: set[tuple[int, str]] = set()

    def sample(self) -> UsageSample:
        """Every card that answers, now; raises only when the card list itself cannot be read."""
        now = self._clock()
        cards = []
        for index, handle in enumerate(self._handles()):
            card = self._card(index, handle, now)
            if card is not None:
                cards.append(card)
        return UsageSample(now, tuple(cards))

    def _card(self, index: int, handle: Any, now: float) -> CardUsage | None:
        n = self._nvml
        try:
            utilization = int(n.nvmlDeviceGetUtilizationRates(handle).gpu)
            memory = n.nvmlDeviceGetMemoryInfo(handle)
        except Exception as exc:
            self._report(index, "card", f"card {index}: NVML cannot read utilisation or memory ({exc}); "
                                        "counted as active")
            return None
        return CardUsage(index, utilization, int(memory.used) // MIB, int(memory.total) // MIB,
                         self._processes(index, handle, now))

    def _processes(self, index: int, handle: Any, now: float) -> tuple[ProcessUsage, ...]:
        n = self._nvml
        try:
            running = list(n.nvmlDeviceGetComputeRunningProcesses(handle))
        except Exception as exc:
            self._report(index, "processes", f"card {index}: NVML cannot list its processes ({exc})")
            return ()
        sm = self._sm_shares(index, handle, now)
        return tuple(ProcessUsage(int(p.pid), _mib(getattr(p, "usedGpuMemory", None)), sm.get(int(p.pid)))
                     for p in sorted(running, key=lambda p: int(p.pid)))

    def _sm_shares(self, index: int, handle: Any, now: float) -> dict[int, int]:
        n = self._nvml
        since = self._last_seen_us.get(index, int(now * 1_000_000) - FIRST_LOOKBACK_US)
        try:
            samples = list(n.nvmlDeviceGetProcessUtilization(handle, since))
        except Exception as exc:
            if getattr(exc, "value", None) == getattr(n, "NVML_ERROR_NOT_FOUND", object()):
                return {}  # no process ran a kernel since the last sample
            self._report(index, "sm", f"card {index}: NVML gives no per-process SM use ({exc})")
            return {}
        shares: dict[int, int] = {}
        for s in samples:
            shares[int(s.pid)] = max(shares.get(int(s.pid), 0), int(s.smUtil))
            self._last_seen_us[index] = max(self._last_seen_us.get(index, 0), int(s.timeStamp))
        return shares

    def _report(self, index: int, what: str, message: str) -> None:
        if (index, what) not in self._reported:
            self._reported.add((index, what))
            log.warning("%s", message)


def _mib(used: Any) -> int:
    """Bytes as MiB; NVML reports ``None`` (or a huge sentinel) where the driver hides the value."""
    if used is None or int(used) >= 2**63:
        return 0
    return int(used) // MIB
