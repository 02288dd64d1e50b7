"""The extender's periodic work: expire bookings, refresh the workload profile, report problems.

Why a loop of its own (not in the watch or the HTTP handlers): expiry depends on the clock, not on
events (an unbound assignment expires although nothing about its pod changes); the profile and the
garbage-collection freeze are too slow for a request; and Events are API writes, which must never
run under the cache lock. Every ``interval_s`` one :meth:`Housekeeping.tick`:

1. re-evaluates unbound assignments and pins against the clock (:meth:`ClusterCache.expire`);
2. once synced, and then every ``profile_every`` ticks (every tick while no pod is known, so that
   an extender started on an empty cluster scores by the first pods' shapes, not all nodes alike),
   rebuilds the scheduler with the workload profile of the pods known now and freezes the
   long-lived objects out of full collections (:mod:`gpupool.extender.gc_freeze`);
3. posts the cache's booking notices (over-committed cards, unreadable assignments) as Events on
   the pods involved, on the leader only (every replica sees the same conflicts).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpupool.extender.cache import ClusterCache
from gpupool.extender.gc_freeze import freeze_long_lived
from gpupool.kube.podapi import ApiError, PodApi

log = logging.getLogger(__name__)

INTERVAL_S = 5.0
PROFILE_EVERY = 60
"""Ticks between profile refreshes (5 minutes at the default interval)."""


@dataclass(frozen=True)
class HousekeepingSettings:
    """How often the loop runs and refreshes the profile."""

    interval_s: float = INTERVAL_S
    profile_every: int = PROFILE_EVERY


class Housekeeping:
    """One replica's periodic work over its :class:`ClusterCache`."""

    def __init__(self, cache: ClusterCache, events: PodApi | None = None, *,
                 is_leader: Callable[[], bool] = lambda: True,
                 settings: HousekeepingSettings | None = None,
                 freeze: Callable[[], int] = freeze_long_lived) -> None:
        self.cache = cache
        self.events = events
        self.is_leader = is_leader
        self.settings = settings or HousekeepingSettings()
        self.freeze = freeze
        self.ticks = 0
        self.profiled = False

    def tick(self) -> None:
        """One round of the work above; API failures are logged, never raised."""
        self.cache.expire()
        self.ticks += 1
        due = not self.profiled or self.cache.profile is None or self.ticks % self.settings.profile_every == 0
        if self.cache.synced and due:
            self.cache.refresh_profile()  # fragmentation policies score against the running workload
            self.profiled = True
            frozen = self.freeze()  # keep full GC pauses out of filter/prioritize
            log.debug("%d long-lived objects exempt from garbage collection", frozen)
        self.report()

    def report(self) -> int:
        """Post the pending booking notices as Events; returns how many were posted.

        Taken notices are not retried: each is logged when it arises, and the conflict stays
        visible in ``/metrics`` until it is resolved. A follower drops them (the leader reports).
        """
        notices = self.cache.take_notices()
        if self.events is None or not notices or not self.is_leader():
            return 0
        posted = 0
        for notice in notices:
            namespace, _, name = notice.pod_key.partition("/")
            try:
                self.events.create_pod_event(namespace, name, notice.uid, notice.reason, notice.message)
                posted += 1
            except ApiError as exc:
                log.warning("could not record event %s on pod %s: %s", notice.reason, notice.pod_key, exc)
        return posted

    def run(self, stop: threading.Event) -> None:
        """Tick every ``interval_s`` until ``stop`` is set; a failing tick is logged and the loop goes on."""
        while not stop.wait(self.settings.interval_s):
            try:
                self.tick()
            except Exception:  # the loop must outlive a bug in one round
                log.exception("housekeeping round failed")

    def start(self, stop: threading.Event) -> threading.Thread:
        """Run on a daemon thread."""
        thread = threading.Thread(target=self.run, args=(stop,), name="gpupool-housekeeping", daemon=True)
        thread.start()
        return thread
