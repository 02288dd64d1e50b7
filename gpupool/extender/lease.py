"""Leader election on a coordination.k8s.io/v1 Lease, so that exactly one replica binds.

Why: filter and prioritize are read-only and any replica's cache answers them, but two binders with
two ledgers could each give away the same slice. The leader holds the Lease and renews it every
``retry_period``; it considers itself leader only until ``renew_deadline`` after the *start* of its
last successful renewal (shorter than ``lease_duration``), so a partitioned leader stops binding
before anyone else may take over. Updates carry the Lease's resourceVersion: two candidates that
both saw an expired lease cannot both win (the second gets 409).

Expiry is judged as client-go judges it: on the candidate's own monotonic clock, from the moment
it *observed* the current Lease record (the read returned it), never by comparing the holder's
``renewTime`` (another machine's wall clock) with its own. Only the rates of the two replicas'
clocks have to agree (bounded drift), not their readings (no skew assumption); the price is that a
candidate that has just started waits one ``lease_duration`` after its first look before taking an
abandoned Lease.

The default timings (10 s / 6 s / 1 s) are shorter than kube-scheduler's own (15 s / 10 s / 2 s):
GPU pods wait for the extender's binds, so a leader's death must be over within 15 s (a candidate
takes over at most ``lease_duration + 2 retry_period`` plus two API round trips after the last
renewal it saw), while ``renew_deadline`` plus the commit timeout (3.2 s) still ends before anyone
may acquire (docs/extender.md, "High availability"). Every Lease call has a request timeout, so a
stalled apiserver cannot hold the election loop past its deadline; a renewal that comes back after
the deadline it was meant to extend counts for nothing (no new term is started and at once given up,
which used to log "now the leader" and "lost the lease" in the same millisecond).

Each stretch of leadership is a *term*, numbered here (not stored in the Lease). A replica that
becomes leader again after having been without the Lease, even briefly, starts a new term: its
ledger may have missed another leader's bookings and has to catch up first
(:mod:`gpupool.extender.handover`), and a bind begun in an earlier term must not write.
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
    lease_duration: float = 10.0
    renew_deadline: float = 6.0
    retry_period: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("lease timings need 0 < retry period < renew deadline < lease duration "
                             f"(got {self.retry_period}, {self.renew_deadline}, {self.lease_duration})")

    @property
    def request_timeout_s(self) -> float:
        """Timeout of each Lease read or write: an attempt (a read and a write) must fit in the
        renew deadline with a retry to spare, or one stalled call would cost the leadership."""
        return max(0.2, (self.renew_deadline - self.retry_period) / 2)

    @property
    def commit_timeout_s(self) -> float:
        """The longest an assignment write begun as leader may take (the PATCH's request timeout).

        A leader checks its leadership right before the write; the write must be over before
        anyone else may acquire, which is ``lease_duration - renew_deadline`` after the leader's own
        deadline at the earliest. A fifth of that gap is left for clock-rate differences and
        scheduling (4 s of the 5 s with the default timings).
        """
        return max(0.1, 0.8 * (self.lease_duration - self.renew_deadline))

    @property
    def takeover_bound_s(self) -> float:
        """Longest time from a leader's death to a candidate's acquisition, API latency aside: the
        candidate saw the last record at most one retry after it was written, waits one lease
        duration from then, and looks once per retry."""
        return self.lease_duration + 2 * self.retry_period


class LeaderElector:
    """Acquires and renews the Lease on a daemon thread; :meth:`is_leader` is cheap and thread-safe."""

    def __init__(self, coordination_v1: Any, identity: str, settings: LeaseSettings | None = None, *,
                 on_started_leading: Callable[[], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.api = coordination_v1
        self.identity = identity
        self.settings = settings or LeaseSettings()
        self.on_started_leading = on_started_leading
        self.monotonic = monotonic
        self.wall = wall
        # (term, leader until): replaced as one tuple so readers never see a new term with an old
        # deadline or the other way round
        self._lease: tuple[int, float] = (0, 0.0)
        self._holder = ""
        self._observed: tuple[str, float] | None = None  # (record's resourceVersion, local time seen)
        self.stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        """True while the start of the last successful renewal is younger than the renew deadline."""
        return self.monotonic() < self._lease[1]

    def leading_term(self) -> int | None:
        """The current term while leader, else None (one atomic read of term and deadline)."""
        term, until = self._lease
        return term if self.monotonic() < until else None

    def holder(self) -> str:
        """The identity that held the Lease at the last look ("" for ourselves once our deadline
        passed: then we do not know who leads)."""
        if self._holder == self.identity and not self.is_leader():
            return ""
        return self._holder

    def _step_down(self) -> None:
        """Stop binding now: someone else holds the Lease or our update was refused."""
        term, _ = self._lease
        self._lease = (term, 0.0)

    def _observe(self, lease: Any) -> float:
        """Remember when this Lease record was first seen; returns that local time."""
        version = str(getattr(lease.metadata, "resource_version", "") or "")
        seen = self.monotonic()  # after the read returned: never earlier than the write it shows
        if self._observed is None or self._observed[0] != version:
            self._observed = (version, seen)
        return self._observed[1]

    def try_acquire_or_renew(self) -> bool:
        """One attempt; returns whether this replica holds the Lease now."""
        from kubernetes.client import V1Lease, V1LeaseSpec, V1ObjectMeta
        from kubernetes.client.exceptions import ApiException

        s = self.settings
        started = self.monotonic()
        now = self.wall()
        try:
            lease = self.api.read_namespaced_lease(s.name, s.namespace, _request_timeout=s.request_timeout_s)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("reading lease %s/%s: %s", s.namespace, s.name, exc.reason)
                return self.is_leader()
            body = V1Lease(metadata=V1ObjectMeta(name=s.name, namespace=s.namespace),
                           spec=V1LeaseSpec(holder_identity=self.identity,
                                            lease_duration_seconds=int(s.lease_duration),
                                            acquire_time=now, renew_time=now, lease_transitions=0))
            try:
                self.api.create_namespaced_lease(s.namespace, body, _request_timeout=s.request_timeout_s)
            except ApiException as create_exc:
                log.info("creating lease: %s", create_exc.reason)
                self._step_down()
                return False
            return self._won(started)
        spec = lease.spec
        holder = spec.holder_identity or ""
        self._holder = holder
        observed_at = self._observe(lease)
        duration = spec.lease_duration_seconds or int(s.lease_duration)
        expired = self.monotonic() > observed_at + duration
        if holder and holder != self.identity and not expired:
            self._step_down()
            return False
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
            spec.holder_identity = self.identity
        spec.renew_time = now
        spec.lease_duration_seconds = int(s.lease_duration)
        try:
            self.api.replace_namespaced_lease(s.name, s.namespace, lease,  # carries resourceVersion
                                              _request_timeout=s.request_timeout_s)
        except ApiException as exc:
            log.info("renewing lease: %s", exc.reason)
            if exc.status == 409:  # someone else wrote the Lease since we read it
                self._step_down()
            return self.is_leader()
        return self._won(started)

    def _won(self, started: float) -> bool:
        """Our write went through: leader until ``renew_deadline`` after the attempt began.

        An attempt that took longer than that (an apiserver stall) proves nothing about now: the
        Lease says we hold it, but the deadline it would set has passed, so no term starts (and the
        current one, if any, keeps its earlier deadline). The next attempt renews from a fresh start.
        """
        self._holder = self.identity
        term, until = self._lease
        if self.monotonic() >= started + self.settings.renew_deadline:
            log.info("%s: the Lease write took %.1f s, past the renew deadline; not leading until the next "
                     "renewal", self.identity, self.monotonic() - started)
            return self.is_leader()
        new_term = self.monotonic() >= until
        if new_term:
            term += 1
        self._lease = (term, started + self.settings.renew_deadline)
        if new_term:
            log.info("%s is now the gpupool extender leader (term %d)", self.identity, term)
            if self.on_started_leading is not None:
                self.on_started_leading()
        return True

    def release(self, settle: Callable[[float], None] = time.sleep) -> bool:
        """Give the Lease up on a clean shutdown, so a candidate takes it at its next look instead of
        one lease duration later (client-go's ReleaseOnCancel); returns whether it was released.

        Order matters: the election loop is stopped (and waited for, so no renewal races the
        release), leadership ends here, then one commit timeout passes (``settle``) so that every
        assignment write begun under this term has committed or been given up before a successor
        lists pods. Never raises: a failed release costs the successor one lease duration.
        """
        s = self.settings
        self.stop.set()
        if self._thread is not None:
            self._thread.join(2 * s.request_timeout_s + s.retry_period)
        was_leader = self.is_leader()
        self._step_down()
        if not was_leader:
            return False
        settle(s.commit_timeout_s)
        try:
            lease = self.api.read_namespaced_lease(s.name, s.namespace, _request_timeout=s.request_timeout_s)
            if lease.spec.holder_identity != self.identity:
                return False
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = self.wall()
            self.api.replace_namespaced_lease(s.name, s.namespace, lease, _request_timeout=s.request_timeout_s)
        except Exception as exc:  # an API error or a timeout: the successor waits one lease duration
            log.warning("releasing the gpupool extender lease: %s: %s", type(exc).__name__, exc)
            return False
        log.info("%s released the gpupool extender lease", self.identity)
        return True

    def run(self) -> None:
        """Loop until :attr:`stop` is set."""
        while not self.stop.is_set():
            was_leader = self.is_leader()
            try:
                self.try_acquire_or_renew()
            except Exception as exc:  # keep electing whatever the API does
                log.warning("leader election: %s: %s", type(exc).__name__, exc)
            if was_leader and not self.is_leader():
                log.warning("%s lost the gpupool extender lease", self.identity)
            self.stop.wait(self.settings.retry_period)

    def start(self) -> LeaderElector:
        self._thread = threading.Thread(target=self.run, name="gpupool-lease", daemon=True)
        self._thread.start()
        return self
