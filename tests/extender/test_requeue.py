"""A preemptor is nudged (one annotation patch) once the watch has released every victim the
extender named for it on one node; never for a pod that no longer waits, and within bounds."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gpupool.extender.cache import ClusterCache
from gpupool.extender.requeue import FAILED, GONE, NUDGED, Due, PreemptRequeue, RequeueSettings, cache_pending
from gpupool.extender.service import ExtenderService
from gpupool.extender.watch import apply_pod_event
from gpupool.kube.podapi import ApiError
from gpupool.kube.translate import pod_request
from gpupool.testing.fake_api import FakePodApi
from tests.kube.builders import container, node, placed_pod, pod

CARD = 16276
ANNOTATION = "gpupool.io/victims-released"
LOW, HIGH = 100, 100000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class World:
    """An API with pods, the extender's cache fed by its events (a fake watch), the service, and
    the requeue wired as ``gpupool extender`` wires it."""

    def __init__(self, settings: RequeueSettings | None = None) -> None:
        self.api = FakePodApi()
        self.cache = ClusterCache(policy="binpack")
        self.cache.replace_nodes([node("N1", [CARD, CARD]), node("N2", [CARD])])
        self.cache.replace_pods([])
        self.api.listeners.append(lambda kind, obj: apply_pod_event(self.cache, kind, obj))
        self.clock = Clock()
        self.requeue = PreemptRequeue(self.api, pending=cache_pending(self.cache), settings=settings,
                                      clock=self.clock)
        self.cache.release_listeners.append(self.requeue.released)
        self.service = ExtenderService(self.cache, None, preempt_answers=self.requeue)

    def holder(self, name: str, node_name: str, card: int, mib: int, priority: int = LOW) -> None:
        self.api.create_pod(with_priority(placed_pod(name, node_name, card, mib), priority))

    def waiting(self, name: str, mib: int = CARD) -> dict[str, Any]:
        return self.api.create_pod(with_priority(pod(name, container(mib=mib)), HIGH))

    def preempt(self, name: str, victims: dict[str, list[str]], mib: int = CARD) -> dict[str, list[str]]:
        request = pod_request(with_priority(pod(name, container(mib=mib)), HIGH), self.cache.names)
        kept, error = self.service.preempt(request, victims)
        assert error == ""
        return kept

    def uid(self, name: str) -> str:
        return str(self.api.get_pod("default", name)["metadata"]["uid"])

    def patches(self) -> list[str]:
        return [c for c in self.api.calls if c.startswith("patch")]


def with_priority(manifest: dict[str, Any], priority: int) -> dict[str, Any]:
    manifest["spec"]["priority"] = priority
    return manifest


def two_victims() -> World:
    """N1: a and b share card 0, c holds card 1 alone; N2: d. ``urgent`` waits for a whole card."""
    world = World()
    for name, where, card, mib in (("a", "N1", 0, 8000), ("b", "N1", 0, 8000), ("c", "N1", 1, 12000),
                                   ("d", "N2", 0, 12000)):
        world.holder(name, where, card, mib)
    world.waiting("urgent")
    return world


def test_the_preemptor_is_nudged_once_every_victim_on_the_node_is_released() -> None:
    world = two_victims()
    kept = world.preempt("urgent", {"N1": [], "N2": []})
    assert kept == {"N1": [world.uid("c")], "N2": [world.uid("d")]}
    assert world.requeue.tracked() == 1 and world.requeue.run_once() == 0  # nothing released yet
    world.api.delete_pod("default", "c")  # kube-scheduler took N1
    assert world.requeue.run_once() == 1
    annotations = world.api.get_pod("default", "urgent")["metadata"]["annotations"]
    assert annotations[ANNOTATION].startswith("N1 ")
    world.api.delete_pod("default", "d")  # the answer is spent: a later release nudges nothing
    assert world.requeue.run_once() == 0 and world.patches() == ["patch default/urgent"]
    assert world.requeue.tracked() == 0


def test_a_node_with_two_victims_waits_for_both() -> None:
    world = World()
    world.holder("a", "N1", 0, 8000)
    world.holder("b", "N1", 0, 8000)
    world.holder("full", "N1", 1, CARD, priority=HIGH)  # not a victim
    world.waiting("urgent", 12000)
    assert world.preempt("urgent", {"N1": []}, mib=12000) == {"N1": [world.uid("a"), world.uid("b")]}
    world.api.delete_pod("default", "a")
    assert world.requeue.run_once() == 0  # b still holds card 0: a retry would be refused
    world.api.delete_pod("default", "b")
    assert world.requeue.run_once() == 1


def test_a_victim_that_finishes_counts_as_released() -> None:
    world = two_victims()
    world.preempt("urgent", {"N1": []})
    world.api.set_pod_phase("default", "c", "Failed")
    assert world.requeue.run_once() == 1


def test_a_victim_whose_assignment_cannot_be_read_counts_once_it_is_gone() -> None:
    """Such a pod keeps its node closed to GPU pods until it is evicted too (it books its CPU and
    memory only)."""
    world = World()
    broken = with_priority(pod("broken", container(mib=1000), node_name="N2",
                               annotations={"gpupool.io/assignment-v1": "{"}), LOW)
    world.api.create_pod(broken)
    world.waiting("urgent")
    assert world.preempt("urgent", {"N2": [world.uid("broken")]}) == {"N2": [world.uid("broken")]}
    world.api.delete_pod("default", "broken")
    assert world.requeue.run_once() == 1


@pytest.mark.parametrize("ends", [
    pytest.param(lambda w: w.api.delete_pod("default", "urgent"), id="preemptor-deleted"),
    pytest.param(lambda w: w.api.create_pod(with_priority(pod("urgent", node_name="N2"), HIGH)) if
                 w.api.delete_pod("default", "urgent") is None else None, id="preemptor-replaced-by-a-bound-pod"),
])
def test_a_preemptor_that_no_longer_waits_is_not_nudged(ends: Any) -> None:
    world = two_victims()
    world.preempt("urgent", {"N1": []})
    ends(world)
    world.api.delete_pod("default", "c")
    assert world.requeue.run_once() == 0
    assert world.patches() == [] and world.requeue.stats[GONE] == 1


def test_a_preemptor_the_api_shows_bound_is_not_nudged() -> None:
    """The cache may lag the API: the nudge reads the pod first and leaves a bound one alone."""
    world = two_victims()
    world.preempt("urgent", {"N1": []})
    world.api.delete_pod("default", "c")
    world.api.listeners.clear()  # the watch falls behind
    world.api.bind_pod("default", "urgent", world.uid("urgent"), "N1")
    assert world.requeue.run_once() == 0 and world.requeue.stats[GONE] == 1 and world.patches() == []


def test_an_answer_whose_victims_are_never_deleted_expires() -> None:
    world = two_victims()
    world.preempt("urgent", {"N1": []})
    world.clock.now += RequeueSettings().ttl_s + 1
    assert world.requeue.expire() == 1 and world.requeue.tracked() == 0
    world.api.delete_pod("default", "c")
    assert world.requeue.run_once() == 0


def test_an_answer_is_forgotten_once_its_pod_no_longer_waits() -> None:
    world = two_victims()
    world.preempt("urgent", {"N1": []})
    world.api.delete_pod("default", "urgent")
    assert world.requeue.expire() == 1 and world.requeue.tracked() == 0


def test_a_pod_the_watch_has_not_delivered_yet_is_watched_and_nudged_once_it_has() -> None:
    world = two_victims()
    world.api.delete_pod("default", "urgent")
    world.api.listeners.clear()  # the watch lags: "urgent" comes back, the extender does not see it
    world.waiting("urgent")
    world.preempt("urgent", {"N1": []})
    assert world.requeue.tracked() == 1 and world.requeue.expire() == 0
    world.api.listeners.append(lambda kind, obj: apply_pod_event(world.cache, kind, obj))
    world.api.touch_pod("default", "urgent")  # the watch catches up
    world.api.delete_pod("default", "c")
    assert world.requeue.run_once() == 1


def test_a_pod_never_delivered_is_not_nudged() -> None:
    world = two_victims()
    assert world.preempt("stranger", {"N1": []}) != {}
    world.api.delete_pod("default", "c")
    assert world.requeue.run_once() == 0 and world.requeue.stats[GONE] == 1 and world.patches() == []


def test_no_further_victims_while_the_first_are_being_evicted() -> None:
    """kube-scheduler retried before the watch showed c's delete: the filter still refuses N1, and
    a second answer would evict d on N2 too, for one pod."""
    world = two_victims()
    assert world.preempt("urgent", {"N1": []}) == {"N1": [world.uid("c")]}
    assert world.preempt("urgent", {"N2": []}) == {}
    assert world.requeue.awaiting("default/urgent")
    world.api.delete_pod("default", "c")
    assert world.requeue.run_once() == 1
    # N1 has room now: kube-scheduler asking again raced the release (its filter refused N1 before
    # the watch released c), and an answer would evict d too, for a pod that fits on N1
    assert world.requeue.awaiting("default/urgent")
    assert world.preempt("urgent", {"N2": []}) == {}
    world.clock.now += RequeueSettings().hold_s  # room another pod took meanwhile blocks it only so long
    assert not world.requeue.awaiting("default/urgent")
    assert world.preempt("urgent", {"N2": []}) == {"N2": [world.uid("d")]}  # it still waits: may preempt again


def test_a_victim_never_deleted_blocks_further_answers_only_for_a_while() -> None:
    world = two_victims()
    world.preempt("urgent", {"N1": []})
    world.clock.now += RequeueSettings().hold_s
    assert world.preempt("urgent", {"N2": []}) == {"N2": [world.uid("d")]}  # replaces the first answer
    world.api.delete_pod("default", "c")
    assert world.requeue.run_once() == 0
    world.api.delete_pod("default", "d")
    assert world.requeue.run_once() == 1


def test_a_patch_that_meets_a_newer_version_reads_the_pod_again() -> None:
    world = two_victims()
    world.preempt("urgent", {"N1": []})
    world.api.conflicts_to_inject = 2
    world.api.delete_pod("default", "c")
    assert world.requeue.run_once() == 1
    assert world.patches() == ["patch default/urgent"] * 3


class BrokenApi(FakePodApi):
    def patch_pod_annotations(self, namespace: str, name: str, resource_version: str,
                              annotations: dict[str, str | None]) -> dict[str, Any]:
        raise ApiError("PATCH: HTTP 403 forbidden", 403)


def test_an_api_that_refuses_the_patch_is_logged_and_the_loop_goes_on() -> None:
    requeue = PreemptRequeue(BrokenApi(), pending=lambda _key: "u1")
    requeue.api.create_pod({"metadata": {"name": "p", "uid": "u1"}})  # type: ignore[attr-defined]
    assert requeue.nudge(Due("default/p", "u1", "N1")) == FAILED


def test_many_waiting_pods_are_nudged_within_the_rate_and_the_bounds() -> None:
    settings = RequeueSettings(max_tracked=40, max_due=30, rate_per_s=2.0, burst=5)
    clock = Clock()
    api = FakePodApi()
    requeue = PreemptRequeue(api, pending=lambda key: f"uid-{key}", settings=settings, clock=clock)
    for i in range(50):
        api.create_pod({"metadata": {"name": f"p{i}", "uid": f"uid-default/p{i}"}})
        requeue.remember(f"default/p{i}", {"N": {f"default/v{i}"}})
    assert requeue.tracked() == 40 and requeue.stats["dropped"] == 10  # the 10 oldest forgotten
    for i in range(50):
        requeue.released(f"default/v{i}")
    assert requeue.stats["dropped"] == 20  # 40 due, 30 kept
    assert requeue.run_once() == 5  # the burst
    clock.now += 1.0
    assert requeue.run_once() == 2  # one second at 2/s
    clock.now += 100.0
    assert requeue.run_once() == 5  # a full bucket, no more
    assert requeue.run_once() == 0  # the bucket is empty
    for _ in range(10):
        clock.now += 100.0
        requeue.run_once()
    assert requeue.stats[NUDGED] == 30 and requeue.stats[GONE] == 0  # each kept one exactly once


def test_a_failing_listener_does_not_stop_the_ledger() -> None:
    world = two_victims()

    def broken(_key: str) -> None:
        raise RuntimeError("bug")

    world.cache.release_listeners.insert(0, broken)
    world.preempt("urgent", {"N1": []})
    world.api.delete_pod("default", "c")
    assert "default/c" not in world.cache.state.placements
    assert world.requeue.run_once() == 1


def test_the_thread_nudges_as_soon_as_the_victim_is_released() -> None:
    world = World(RequeueSettings(idle_wait_s=60.0))
    world.requeue.clock = time.monotonic
    world.holder("c", "N1", 1, 12000)
    world.holder("a", "N1", 0, CARD, priority=HIGH)
    world.waiting("urgent")
    world.preempt("urgent", {"N1": []})
    stop = threading.Event()
    thread = world.requeue.start(stop)
    try:
        started = time.monotonic()
        world.api.delete_pod("default", "c")
        while not world.patches() and time.monotonic() - started < 5:
            time.sleep(0.005)
        assert world.patches() == ["patch default/urgent"]
        assert time.monotonic() - started < 1.0  # woken by the release, not by the 60 s idle wait
    finally:
        stop.set()
        world.requeue.wake()
        thread.join(timeout=5)
    assert not thread.is_alive()
