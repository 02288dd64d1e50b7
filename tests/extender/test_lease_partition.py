"""A live leader cut from the apiserver: it steps down on its own clock, and never leads beside another.

The e2e (tests/e2e/test_extender_partition_e2e.py) shows this against a real apiserver; here the two
replicas step through a partition on one fake clock, tick by tick, with the shipped timings
(10 s / 6 s / 1 s), so every moment is checked rather than the ones a poll happens to sample.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import V1Lease
from urllib3.exceptions import MaxRetryError, ReadTimeoutError

from gpupool.extender.lease import LeaderElector, LeaseSettings
from tests.extender.lease_fakes import FakeClock, FakeCoordination

SETTINGS = LeaseSettings(namespace="default")
TICK = 0.05


class Partitioned:
    """One replica's view of the shared API: every call fails while :attr:`cut` (as urllib3 raises
    it through the client: a reset connection or a read that times out)."""

    def __init__(self, api: FakeCoordination, error: Exception) -> None:
        self.api = api
        self.error = error
        self.cut = False

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.api, name)

        def maybe(*args: object, **kwargs: object) -> V1Lease:
            if self.cut:
                raise self.error
            return call(*args, **kwargs)  # type: ignore[no-any-return]
        return maybe


def attempt(elector: LeaderElector) -> bool:
    """One turn of :meth:`LeaderElector.run`'s loop (it swallows every error the same way); whether
    the attempt itself won or renewed the Lease."""
    try:
        return elector.try_acquire_or_renew()
    except Exception:  # as run() does
        return False


@pytest.mark.parametrize("error", [
    MaxRetryError(None, "/apis/coordination.k8s.io", "connection reset"),  # type: ignore[arg-type]
    ReadTimeoutError(None, "/apis/coordination.k8s.io", "read timed out"),  # type: ignore[arg-type]
], ids=["reset", "black-hole"])
@pytest.mark.parametrize("cut_phase", [0.0, 0.3, 0.7])
def test_a_cut_leader_stops_on_its_own_clock_before_the_follower_leads_and_not_again_after_healing(
        error: Exception, cut_phase: float) -> None:
    clock, api = FakeClock(), FakeCoordination()
    view = Partitioned(api, error)
    a = LeaderElector(view, "a", SETTINGS, monotonic=clock.monotonic, wall=clock.wall)
    b = LeaderElector(api, "b", SETTINGS, monotonic=clock.monotonic, wall=clock.wall)
    start = clock.now
    cut_at = start + 5 * SETTINGS.retry_period + cut_phase
    a_renewed = 0.0  # when a's last successful renewal began
    a_last_led = b_first_led = None
    healed_at = None
    a_next, b_next = start, start + 0.5
    while clock.now < start + 60:
        if not view.cut and clock.now >= cut_at and healed_at is None:
            view.cut = True
        if b_first_led is not None and healed_at is None and clock.now >= b_first_led + 5:
            view.cut, healed_at = False, clock.now
        if clock.now >= a_next:
            if attempt(a) and healed_at is None:
                a_renewed = clock.now
            a_next += SETTINGS.retry_period
        if clock.now >= b_next:
            attempt(b)
            b_next += SETTINGS.retry_period
        assert not (a.is_leader() and b.is_leader()), f"two leaders at {clock.now - start:.2f} s"
        if a.is_leader():
            a_last_led = clock.now
        if b.is_leader() and b_first_led is None:
            b_first_led = clock.now
        clock.advance(TICK)

    assert a_last_led is not None and b_first_led is not None and healed_at is not None
    # a stopped without any answer from the apiserver, renew deadline after its last renewal began
    assert a_last_led < a_renewed + SETTINGS.renew_deadline <= cut_at + SETTINGS.renew_deadline
    # b led only once a's last write (begun by its deadline, bounded by the commit timeout) was over
    assert b_first_led >= a_renewed + SETTINGS.renew_deadline + SETTINGS.commit_timeout_s
    assert b_first_led - cut_at <= SETTINGS.takeover_bound_s + SETTINGS.retry_period
    # after the heal a reads b's Lease, renewed every second: it stays a follower for good
    assert a_last_led < cut_at + SETTINGS.renew_deadline and not a.is_leader() and b.is_leader()
    assert a.holder() == "b" and a.leading_term() is None
