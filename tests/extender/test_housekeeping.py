"""The periodic work: expiry against the clock, the profile after sync, Events on the leader only."""

from __future__ import annotations

import threading

import pytest

from gpupool.extender.bookings import OVERCOMMITTED
from gpupool.extender.cache import ClusterCache
from gpupool.extender.housekeeping import Housekeeping, HousekeepingSettings
from gpupool.kube.podapi import ApiError
from gpupool.testing.fake_api import FakePodApi
from tests.kube.builders import node, placed_pod

NOW = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def over_committed(clock: Clock) -> ClusterCache:
    cache = ClusterCache(policy="fgd", unconfirmed_timeout_s=60, clock=clock)
    cache.replace_nodes([node("n1", [16384, 16384])])
    cache.replace_pods([placed_pod("a", "n1", 0, 12288, when=NOW), placed_pod("b", "n1", 0, 12288, when=NOW),
                        placed_pod("late", "n1", 1, 1, bound=False, when=NOW)])
    return cache


def test_a_tick_expires_refreshes_the_profile_once_synced_and_freezes() -> None:
    clock = Clock()
    cache = over_committed(clock)
    frozen: list[int] = []
    work = Housekeeping(cache, settings=HousekeepingSettings(profile_every=3), freeze=lambda: frozen.append(1) or 7)
    work.tick()
    assert cache.profile is not None and len(frozen) == 1  # synced: profiled at the first tick
    scheduler = cache.scheduler
    work.tick()
    assert cache.scheduler is scheduler and len(frozen) == 1
    work.tick()  # the third tick: profile_every
    assert cache.scheduler is not scheduler and len(frozen) == 2
    assert "default/late" in cache.state.placements
    clock.now += 61
    work.tick()
    assert "default/late" not in cache.state.placements  # never bound: expired


def test_an_empty_cluster_is_profiled_again_at_every_tick_until_pods_arrive() -> None:
    """An extender started before any pod would otherwise score every node alike for minutes."""
    cache = ClusterCache(policy="fgd", unconfirmed_timeout_s=60, clock=Clock())
    cache.replace_nodes([node("n1", [16384, 16384])])
    cache.replace_pods([])
    work = Housekeeping(cache, settings=HousekeepingSettings(profile_every=1000), freeze=lambda: 0)
    work.tick()
    assert cache.profile is None
    cache.upsert_pod(placed_pod("a", "n1", 0, 4096, when=NOW))
    work.tick()  # far from profile_every: refreshed because there was no profile
    assert cache.profile is not None
    scheduler = cache.scheduler
    work.tick()
    assert cache.scheduler is scheduler  # a profile exists: back to every profile_every ticks


def test_notices_become_events_on_the_pods_on_the_leader_only() -> None:
    clock = Clock()
    api = FakePodApi()
    follower = Housekeeping(over_committed(clock), api, is_leader=lambda: False)
    assert follower.report() == 0 and api.events == []
    leader = Housekeeping(over_committed(clock), api)
    assert leader.report() == 2
    assert [(e["involvedObject"]["name"], e["reason"], e["type"]) for e in api.events] == [
        ("a", OVERCOMMITTED, "Warning"), ("b", OVERCOMMITTED, "Warning")]
    assert api.events[0]["involvedObject"]["uid"] == "uid-default-a"
    assert "over-committed" in api.events[0]["message"]
    assert leader.report() == 0  # each notice once


def test_an_event_the_api_refuses_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    api = FakePodApi()

    def refuse(*_: object) -> None:
        raise ApiError("POST event: HTTP 403 forbidden", 403)

    api.create_pod_event = refuse  # type: ignore[method-assign]
    work = Housekeeping(over_committed(Clock()), api)
    assert work.report() == 0
    assert "could not record event" in caplog.text


def test_the_loop_ticks_until_stopped() -> None:
    cache = over_committed(Clock())
    ticked = threading.Event()
    work = Housekeeping(cache, settings=HousekeepingSettings(interval_s=0.01), freeze=lambda: ticked.set() or 0)
    stop = threading.Event()
    thread = work.start(stop)
    assert ticked.wait(5)
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and work.ticks >= 1
