"""Leader election over a fake coordination API with the apiserver's resourceVersion rules."""

from __future__ import annotations

import copy
import datetime as dt
import logging

import pytest
from kubernetes.client import V1Lease
from kubernetes.client.exceptions import ApiException

from gpupool.extender.lease import LeaderElector, LeaseSettings
from tests.extender.lease_fakes import FakeClock, FakeCoordination

SETTINGS = LeaseSettings(namespace="default", lease_duration=15.0, renew_deadline=10.0, retry_period=2.0)


def elector(api: FakeCoordination, clock: FakeClock, name: str, started: list[str] | None = None,
            settings: LeaseSettings = SETTINGS) -> LeaderElector:
    hook = (lambda: started.append(name)) if started is not None else None
    return LeaderElector(api, name, settings, on_started_leading=hook, monotonic=clock.monotonic,
                         wall=clock.wall)


def test_one_leader_then_takeover_after_expiry() -> None:
    api, clock, started = FakeCoordination(), FakeClock(), []
    a, b = elector(api, clock, "a", started), elector(api, clock, "b", started)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.is_leader() and not b.is_leader()
    assert b.holder() == "a"
    clock.advance(2)
    assert a.try_acquire_or_renew()  # renewal keeps it
    assert not b.try_acquire_or_renew()  # b sees the renewed record: its 15 s start again
    clock.advance(10.5)
    assert not a.is_leader()  # past the renew deadline without renewing: stop binding
    assert not b.try_acquire_or_renew()  # 10.5 s after b saw the record: not expired yet
    clock.advance(5)
    assert b.try_acquire_or_renew() and b.is_leader()
    assert api.leases["gpupool-extender"].spec.lease_transitions == 1
    assert not a.try_acquire_or_renew()
    assert started == ["a", "b"]


def test_expiry_is_judged_on_the_candidates_clock_not_the_holders_renew_time() -> None:
    """A holder whose wall clock is an hour behind looks long expired by its renewTime; the
    candidate still waits lease_duration after it saw the record (no clock-skew assumption)."""
    api, clock = FakeCoordination(), FakeClock()
    skewed = LeaderElector(api, "a", SETTINGS, monotonic=clock.monotonic,
                           wall=lambda: clock.wall() - dt.timedelta(hours=1))
    b = elector(api, clock, "b")
    assert skewed.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    clock.advance(9)
    assert skewed.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert skewed.is_leader() and b.holder() == "a"


def test_terms_count_each_stretch_of_leadership() -> None:
    api, clock, started = FakeCoordination(), FakeClock(), []
    a = elector(api, clock, "a", started)
    assert a.try_acquire_or_renew() and a.leading_term() == 1
    clock.advance(2)
    assert a.try_acquire_or_renew() and a.leading_term() == 1  # a renewal in time: same term
    clock.advance(11)
    assert a.leading_term() is None  # deadline passed: no term while not leading
    assert a.try_acquire_or_renew() and a.leading_term() == 2  # back, but possibly after others
    assert started == ["a", "a"]


def test_losing_the_lease_to_another_holder_stops_leading_at_once() -> None:
    api, clock = FakeCoordination(), FakeClock()
    a = elector(api, clock, "a")
    assert a.try_acquire_or_renew()
    lease = api.leases["gpupool-extender"]
    lease.spec.holder_identity = "intruder"  # e.g. an operator handing the Lease over
    api.version += 1
    lease.metadata.resource_version = str(api.version)
    assert not a.try_acquire_or_renew()
    assert not a.is_leader() and a.leading_term() is None  # long before its own deadline


def test_a_refused_renewal_stops_leading_at_once_other_errors_do_not() -> None:
    api, clock = FakeCoordination(), FakeClock()
    a = elector(api, clock, "a")
    assert a.try_acquire_or_renew()
    original = api.replace_namespaced_lease

    def failing(status: int) -> None:
        def replace(name: str, namespace: str, body: object, **_: object) -> object:
            raise ApiException(status=status, reason="injected")
        api.replace_namespaced_lease = replace  # type: ignore[method-assign,assignment]

    failing(500)
    clock.advance(2)
    assert a.try_acquire_or_renew() and a.is_leader()  # a flaky API: leader until the deadline
    failing(409)
    assert not a.try_acquire_or_renew() and not a.is_leader()  # someone else wrote the Lease
    api.replace_namespaced_lease = original  # type: ignore[method-assign]


def test_two_candidates_racing_for_an_expired_lease_cannot_both_win() -> None:
    api, clock = FakeCoordination(), FakeClock()
    a, b, c = elector(api, clock, "a"), elector(api, clock, "b"), elector(api, clock, "c")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not c.try_acquire_or_renew()
    clock.advance(16)
    stale = api.read_namespaced_lease("gpupool-extender", "default")
    assert b.try_acquire_or_renew()
    original = api.read_namespaced_lease
    api.read_namespaced_lease = lambda name, namespace, **_: copy.deepcopy(stale)  # type: ignore[method-assign]
    assert not c.try_acquire_or_renew()  # saw the expired lease too, but its update is refused
    api.read_namespaced_lease = original  # type: ignore[method-assign]
    assert api.leases["gpupool-extender"].spec.holder_identity == "b"


def test_commit_timeout_fits_between_renew_deadline_and_lease_duration() -> None:
    assert SETTINGS.commit_timeout_s == 4.0
    assert LeaseSettings().commit_timeout_s < LeaseSettings().lease_duration - LeaseSettings().renew_deadline


def test_a_lapsed_leader_does_not_name_itself_as_the_leader() -> None:
    api, clock = FakeCoordination(), FakeClock()
    a = elector(api, clock, "a")
    assert a.try_acquire_or_renew() and a.holder() == "a"
    clock.advance(11)
    assert a.holder() == ""


def test_default_timings_take_over_within_15_s_and_keep_the_commit_window() -> None:
    """A leader's death is over within 15 s (lease duration plus two retries, API time aside), and
    the renew deadline plus the commit timeout still end before anyone may acquire."""
    default = LeaseSettings()
    assert default.takeover_bound_s <= 12.0
    assert default.renew_deadline + default.commit_timeout_s < default.lease_duration
    assert 2 * default.request_timeout_s + default.retry_period <= default.renew_deadline


def test_impossible_timings_are_refused() -> None:
    with pytest.raises(ValueError, match="renew deadline < lease duration"):
        LeaseSettings(lease_duration=5.0, renew_deadline=6.0)


def test_every_lease_call_has_a_request_timeout() -> None:
    api, clock = FakeCoordination(), FakeClock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock.advance(2)
    assert a.try_acquire_or_renew()
    assert api.timeouts == {SETTINGS.request_timeout_s}


class StallingCoordination(FakeCoordination):
    """Reads that take ``stall_s`` on the shared fake clock (an apiserver that stops answering)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.stall_s = 0.0

    def read_namespaced_lease(self, name: str, namespace: str, **kwargs: object) -> V1Lease:
        self.clock.advance(self.stall_s)
        return super().read_namespaced_lease(name, namespace, **kwargs)


def test_a_renewal_answered_after_its_deadline_does_not_flap(caplog: pytest.LogCaptureFixture) -> None:
    """After an API stall longer than the renew deadline the write still lands; it used to start a
    new term that was over at once ("now the leader" and "lost the lease" in one millisecond)."""
    clock = FakeClock()
    api = StallingCoordination(clock)
    started: list[str] = []
    a = elector(api, clock, "a", started)
    assert a.try_acquire_or_renew() and a.leading_term() == 1
    api.stall_s = 12.0
    with caplog.at_level(logging.INFO, logger="gpupool.extender.lease"):
        assert not a.try_acquire_or_renew()
    assert a.leading_term() is None and started == ["a"]
    assert not any("now the gpupool extender leader" in r.getMessage() for r in caplog.records)
    api.stall_s = 0.0
    assert a.try_acquire_or_renew() and a.leading_term() == 2  # the next, prompt renewal leads again
    assert started == ["a", "a"]


def test_release_hands_the_lease_to_the_next_look_of_a_candidate() -> None:
    api, clock = FakeCoordination(), FakeClock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    settled: list[float] = []
    assert a.release(settle=settled.append)
    assert settled == [SETTINGS.commit_timeout_s]  # in-flight writes end before anyone may list
    assert not a.is_leader() and a.stop.is_set()
    assert b.try_acquire_or_renew()  # no lease duration to wait
    assert not a.release(settle=settled.append)  # not leading: nothing to give up
    assert api.leases["gpupool-extender"].spec.holder_identity == "b"


class SlowCoordination(FakeCoordination):
    """Every Lease call takes ``latency_s`` on the shared fake clock before it reaches the store."""

    def __init__(self, clock: FakeClock, latency_s: float) -> None:
        super().__init__()
        self.clock = clock
        self.latency_s = latency_s

    def read_namespaced_lease(self, name: str, namespace: str, **kwargs: object) -> V1Lease:
        self.clock.advance(self.latency_s)
        return super().read_namespaced_lease(name, namespace, **kwargs)

    def replace_namespaced_lease(self, name: str, namespace: str, body: V1Lease, **kwargs: object) -> V1Lease:
        self.clock.advance(self.latency_s)
        return super().replace_namespaced_lease(name, namespace, body, **kwargs)


def takeover(death_phase: float, candidate_phase: float, latency_s: float) -> tuple[float, float]:
    """Replica ``a`` leads with the default timings, renewing every retry period from t = 0, and dies
    ``death_phase`` retry periods after its fifth renewal began; ``b`` looks every retry period,
    ``candidate_phase`` of a period after ``a``. Returns the seconds from ``a``'s death to ``b``'s
    acquisition and from the start of ``a``'s last successful renewal to it."""
    settings = LeaseSettings(namespace="default")
    clock = FakeClock()
    api = SlowCoordination(clock, latency_s)
    a, b = elector(api, clock, "a", settings=settings), elector(api, clock, "b", settings=settings)
    start, retry = clock.now, settings.retry_period
    death = start + (4 + death_phase) * retry
    a_last = b_next = a_next = 0.0
    while True:
        a_at, b_at = start + a_next * retry, start + (b_next + candidate_phase) * retry
        if a_at < death and a_at <= b_at:
            clock.now = max(clock.now, a_at)
            began = clock.now
            if a.try_acquire_or_renew():
                a_last = began
            a_next += 1
            continue
        clock.now = max(clock.now, b_at)
        if b.try_acquire_or_renew():
            return clock.now - death, clock.now - a_last
        b_next += 1
        assert clock.now < death + 60, "b never took over"


@pytest.mark.parametrize("latency_s", [0.0, 0.2])
def test_a_dead_leaders_lease_is_taken_within_15_s_and_never_before_its_writes_end(latency_s: float) -> None:
    """The deadline arithmetic of the default timings (10 s / 6 s / 1 s), stepped on a fake clock for
    every phase of the leader's death and of the candidate's looks: the candidate holds the Lease at
    most ``takeover_bound_s`` (12 s) plus four API calls after the death, within the 15 s issue 28
    asks; and never before the dead leader's renew deadline plus its commit timeout (9.2 s after its
    last renewal began), so every assignment write of its term has ended first."""
    settings = LeaseSettings()
    assert settings.takeover_bound_s == 12.0
    phases = [0.0, 0.01, 0.25, 0.5, 0.75, 0.99]
    worst = 0.0
    for death_phase in phases:
        for candidate_phase in phases[1:]:
            after_death, after_renewal = takeover(death_phase, candidate_phase, latency_s)
            assert after_death <= settings.takeover_bound_s + 4 * latency_s, (death_phase, candidate_phase)
            assert after_renewal >= settings.renew_deadline + settings.commit_timeout_s, (death_phase,
                                                                                          candidate_phase)
            worst = max(worst, after_death)
    assert worst <= 15.0
    assert worst > settings.lease_duration - settings.retry_period  # the bound is not loose by a lease
