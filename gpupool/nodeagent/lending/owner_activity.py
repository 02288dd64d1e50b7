"""Owner activity without a new open: when a lent card's owner computes again, its loan ends.

An owner whose process kept the card open while idle (a notebook kernel between cells) and starts
computing again never opens the card again, so the open-time rules never see it come back. Every
usage sample, each owner of each loan is read from its own container's signals
(:mod:`gpupool.nodeagent.lending.owner_signals`); the owner is **active** in a sample when

* some source gives it SM use of at least ``percent`` **and** the monitor's sample shows the whole
  card at least that busy (a container cannot compute more than its card; this also keeps a stale
  utilisation in a region whose controller stopped from counting), or
* some source shows its memory on the card ``memory_mib`` or more above the lowest that source showed
  since the loan began.

After ``samples`` active samples in a row the owner is back; the lending service then ends the loan
through the same path as an owner's open (rule 1: its borrowers are reclaimed). Signals of borrowers
are never read: only the owners' regions and the NVML processes that hold the card from an owner's
container. No signal (no region, no NVML process data) is never activity.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from gpupool.api.shim_contract import REGION_FILE
from gpupool.nodeagent.isolation.shim_files import ShimFileError, ShimLayout
from gpupool.nodeagent.lending.loans import Loan
from gpupool.nodeagent.lending.options import ActivityThresholds
from gpupool.nodeagent.lending.owner_signals import RegionSignals, Signal, Source, nvml_signal
from gpupool.nodeagent.lending.pods import LendingPod
from gpupool.nodeagent.lending.rules import ContainerKey
from gpupool.nodeagent.monitor.usage_sampling import CardUsage, UsageSample
from gpupool.nodeagent.monitor.usage_state import UsageState

WatchKey = tuple[int, float, ContainerKey]
"""(card, the loan's idle_since, owner): a new loan of the same card starts afresh."""


class ActivityTracker:
    """Per owner of a loan: each source's lowest memory since the loan began and the active streak."""

    def __init__(self, thresholds: ActivityThresholds) -> None:
        self.thresholds = thresholds
        self._lowest: dict[tuple[WatchKey, Source], int] = {}
        self._streak: dict[WatchKey, int] = {}

    def observe(self, key: WatchKey, signals: Iterable[Signal], card_percent: int | None) -> bool:
        """One sample; true once the owner was active in ``samples`` samples in a row (the streak then
        starts again, so a loan that could not be ended is tried again only after as many)."""
        t = self.thresholds
        active = False
        for signal in signals:
            if (signal.compute_percent is not None and card_percent is not None
                    and signal.compute_percent >= t.percent and card_percent >= t.percent):
                active = True
            if signal.memory_mib is not None:
                lowest = min(signal.memory_mib, self._lowest.get((key, signal.source), signal.memory_mib))
                self._lowest[(key, signal.source)] = lowest
                active = active or signal.memory_mib - lowest >= t.memory_mib
        streak = self._streak.get(key, 0) + 1 if active else 0
        if streak >= t.samples:
            streak = 0
            self._streak[key] = streak
            return True
        self._streak[key] = streak
        return False

    def keep(self, keys: Iterable[WatchKey]) -> None:
        """Forget every owner not in ``keys`` (loans that ended)."""
        wanted = set(keys)
        self._streak = {k: v for k, v in self._streak.items() if k in wanted}
        self._lowest = {k: v for k, v in self._lowest.items() if k[0] in wanted}


class OwnerWatch:
    """Reads every owner of every loan once per usage sample and says which are back."""

    def __init__(self, thresholds: ActivityThresholds, pod_of: Callable[[tuple[str, str]], LendingPod | None],
                 shim_state_dir: str | None, regions: RegionSignals | None = None) -> None:
        self.tracker = ActivityTracker(thresholds)
        self._pod_of = pod_of
        self._layout = ShimLayout(shim_state_dir) if shim_state_dir else None
        self._regions = regions or RegionSignals()
        self._last_time: float | None = None

    def observe(self, loans: Mapping[int, Loan], sample: UsageSample | None,
                state: UsageState) -> list[tuple[Loan, ContainerKey]]:
        """The owners found active in ``sample``; nothing when the sample was seen already."""
        if sample is None or sample.time == self._last_time:
            return []
        self._last_time = sample.time
        keys: list[WatchKey] = []
        back = []
        for card, loan in sorted(loans.items()):
            usage = sample.card(card)
            device = state.device(loan.path)
            holders = device.holders if device is not None else ()
            for owner in sorted(loan.owners):
                key = (card, loan.idle_since, owner)
                keys.append(key)
                pids = [h.pid for h in holders if (h.namespace, h.pod, h.container) == owner]
                signals = [s for s in (self._region(owner, card, usage), nvml_signal(usage, pids)) if s is not None]
                if self.tracker.observe(key, signals, usage.utilization_percent if usage is not None else None):
                    back.append((loan, owner))
        self.tracker.keep(keys)
        return back

    def _region(self, owner: ContainerKey, card: int, usage: CardUsage | None) -> Signal | None:
        namespace, name, container = owner
        pod = self._pod_of((namespace, name))
        region = pod.region(container, card) if pod is not None and self._layout is not None else None
        if self._layout is None or pod is None or region is None:
            return None  # no library on this node, or the owner has no share of this card to account in
        try:  # a DRA claim's share is accounted in the claim's region, shared by the containers using it
            directory = self._layout.container_dir(pod.uid, region[0])
        except ShimFileError:
            return None
        ordinal = region[1]
        total = usage.memory_total_mib if usage is not None else None
        return self._regions.signal(Path(os.path.join(directory, REGION_FILE)), ordinal, total)
