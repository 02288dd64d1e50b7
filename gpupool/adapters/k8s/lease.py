"""Leader election on a coordination.k8s.io/v1 Lease, so that exactly one replica binds.

Why: filter and prioritize are read-only and any replica's cache answers them, but two binders with
two ledgers could each give away the same slice. The leader holds the Lease and renews it every
``retry_period``; it considers itself leader only until ``renew_deadline`` after its last successful
renewal (shorter than ``lease_duration``), so a partitioned leader stops binding before anyone
else may take over. Updates carry the Lease's resourceVersion: two candidates that both saw an
expired lease cannot both win (the second gets 409).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    """Timings, as in kube-scheduler's own leader election (seconds)."""

    namespace: str = "kube-system"
    name: str = "gpupool-extender"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class LeaderElector:
    """Acquires and renews the Lease on a daemon thread; :meth:`is_leader` is cheap and thread-safe."""

    def __init__(self, coordination_v1: Any, identity: str, settings: LeaseSettings | None = None, *,
                 on_started_leading: Callable[[], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.api = coordination_v1
        self.identity = identity
        self.settings = settings or LeaseSettings()
        self.on_started_leading = on_started_leading
        self.monotonic = monotonic
        self._leader_until = 0.0
        self._holder = ""
        self._was_leader = False
        self.stop = threading.Event()

    def is_leader(self) -> bool:
        """True while the last successful renewal is younger than the renew deadline."""
        return self.monotonic() < self._leader_until

    def holder(self) -> str:
        """The identity that held the Lease at the last look."""
        return self._holder

    def try_acquire_or_renew(self) -> bool:
        """One attempt; returns whether this replica holds the Lease now."""
        from kubernetes.client import V1Lease, V1LeaseSpec, V1ObjectMeta
        from kubernetes.client.exceptions import ApiException

        s = self.settings
        started = self.monotonic()
        now = dt.datetime.now(dt.UTC)
        try:
            lease = self.api.read_namespaced_lease(s.name, s.namespace)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("reading lease %s/%s: %s", s.namespace, s.name, exc.reason)
                return False
            body = V1Lease(metadata=V1ObjectMeta(name=s.name, namespace=s.namespace),
                           spec=V1LeaseSpec(holder_identity=self.identity,
                                            lease_duration_seconds=int(s.lease_duration),
                                            acquire_time=now, renew_time=now, lease_transitions=0))
            try:
                self.api.create_namespaced_lease(s.namespace, body)
            except ApiException as create_exc:
                log.info("creating lease: %s", create_exc.reason)
                return False
            return self._won(started)
        spec = lease.spec
        holder = spec.holder_identity or ""
        self._holder = holder
        renewed = spec.renew_time or spec.acquire_time
        duration = spec.lease_duration_seconds or int(s.lease_duration)
        expired = renewed is None or now > renewed + dt.timedelta(seconds=duration)
        if holder != self.identity and not expired:
            self._leader_until = 0.0
            return False
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
            spec.holder_identity = self.identity
        spec.renew_time = now
        spec.lease_duration_seconds = int(s.lease_duration)
        try:
            self.api.replace_namespaced_lease(s.name, s.namespace, lease)  # carries resourceVersion
        except ApiException as exc:
            log.info("renewing lease: %s", exc.reason)
            return False
        return self._won(started)

    def _won(self, started: float) -> bool:
        self._holder = self.identity
        self._leader_until = started + self.settings.renew_deadline
        if not self._was_leader:
            self._was_leader = True
            log.info("%s is now the gpupool extender leader", self.identity)
            if self.on_started_leading is not None:
                self.on_started_leading()
        return True

    def run(self) -> None:
        """Loop until :attr:`stop` is set."""
        while not self.stop.is_set():
            try:
                if not self.try_acquire_or_renew() and self._was_leader and not self.is_leader():
                    self._was_leader = False
                    log.warning("%s lost the gpupool extender lease", self.identity)
            except Exception as exc:  # keep electing whatever the API does
                log.warning("leader election: %s: %s", type(exc).__name__, exc)
            self.stop.wait(self.settings.retry_period)

    def start(self) -> LeaderElector:
        threading.Thread(target=self.run, name="gpupool-lease", daemon=True).start()
        return self
