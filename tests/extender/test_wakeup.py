"""Pods the filter refused are nudged when a quota, group, loan, card or node change lets them fit;
only those, only once per change, and within the rate bound."""

from __future__ import annotations

from typing import Any

from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.requeue import cache_pending
from gpupool.extender.service import ExtenderService
from gpupool.extender.wakeup import PendingWakeUp, WakeSettings, filter_arguments
from gpupool.extender.watch import apply_pod_event
from gpupool.kube.translate import TranslationError
from gpupool.testing.fake_api import FakePodApi
from tests.extender.tenancy_world import CARD, gpu_pod, quota, read, world
from tests.kube.builders import node

ANNOTATION = "gpupool.io/retry-after-change"


class World:
    """A synced cache fed by a fake API's pod events, the service, and the wake-up wired to both."""

    def __init__(self, quotas: list[dict[str, Any]], settings: WakeSettings | None = None) -> None:
        self.api = FakePodApi()
        self.cache: ClusterCache = world([node("N1", [CARD] * 4)], quotas=quotas)
        self.api.listeners.append(lambda kind, obj: apply_pod_event(self.cache, kind, obj))
        self.service = ExtenderService(self.cache, None)
        self.clock = 1000.0
        self.wakeup = PendingWakeUp(self.api, self.cache, self.service.fits_somewhere,
                                    pending=cache_pending(self.cache), settings=settings, clock=lambda: self.clock)
        self.service.refused = self.wakeup
        self.wakeup.run_once()  # the first signature

    def waiting(self, name: str, ns: str = "team-a") -> bool:
        """Create a pod asking one whole GPU and filter it; whether it passed."""
        raw = self.api.create_pod(gpu_pod(name, ns, whole=1))
        request, tenant = read(self.cache, raw)
        return bool(self.service.filter(request, ["N1"], tenant=tenant, pod=raw).passed)

    def quota(self, ns: str, whole: int | None) -> None:
        with self.cache.lock:
            if whole is None:
                self.cache.tenancy.remove_quota(quota(ns))
            else:
                self.cache.tenancy.upsert_quota(quota(ns, hard={"wholeGpus": whole}))

    def nudged(self) -> list[str]:
        return sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in self.api.list_pods()
                      if ANNOTATION in (p["metadata"].get("annotations") or {}))


def test_a_quota_raised_wakes_the_pods_it_held_back_and_only_those() -> None:
    w = World([quota("team-a", hard={"wholeGpus": 0}), quota("team-b", hard={"wholeGpus": 0})])
    assert not w.waiting("a1") and not w.waiting("a2") and not w.waiting("b1", "team-b")
    assert w.wakeup.tracked() == 3
    assert w.wakeup.run_once() == 0 and w.wakeup.stats["checked"] == 0  # nothing changed: no check
    w.quota("team-a", 2)
    assert w.wakeup.run_once() == 2
    assert w.nudged() == ["team-a/a1", "team-a/a2"]  # team-b's quota still holds b1 back
    assert w.wakeup.tracked() == 1 and w.wakeup.stats["still_refused"] == 1
    assert w.wakeup.run_once() == 0  # once per change


def test_a_quota_deleted_wakes_its_pods() -> None:
    w = World([quota("team-a", hard={"wholeGpus": 0})])
    assert not w.waiting("a1")
    w.quota("team-a", None)
    assert w.wakeup.run_once() == 1 and w.nudged() == ["team-a/a1"]


def test_a_change_that_does_not_let_the_pod_fit_nudges_nothing() -> None:
    w = World([quota("team-a", hard={"wholeGpus": 0})])
    assert not w.waiting("a1")
    w.quota("team-a", 0)  # a new version of the object, the same limit
    w.quota("team-b", 5)
    assert w.wakeup.run_once() == 0 and w.nudged() == []
    assert w.wakeup.tracked() == 1  # still waits for a change that helps


def test_a_pod_bound_or_deleted_meanwhile_is_forgotten_without_a_nudge() -> None:
    w = World([quota("team-a", hard={"wholeGpus": 0})])
    assert not w.waiting("a1") and not w.waiting("a2")
    w.api.delete_pod("team-a", "a1")
    w.api.bind_pod("team-a", "a2", w.api.get_pod("team-a", "a2")["metadata"]["uid"], "N1")
    w.quota("team-a", 2)
    assert w.wakeup.run_once() == 0 and w.nudged() == []
    assert w.wakeup.tracked() == 0


def test_a_pod_that_ended_wakes_the_pods_its_quota_use_held_back() -> None:
    """kube-scheduler retries a refused pod on the deletion event, often before the extender's watch
    gave the quota back: the extender must wake it once the release is in its ledger."""
    w = World([quota("team-a", hard={"wholeGpus": 1})])
    assert w.waiting("a1")
    Binder(w.cache, w.api).bind("team-a", "a1", w.api.get_pod("team-a", "a1")["metadata"]["uid"], "N1")
    assert not w.waiting("a2")  # the quota's one GPU is a1's
    assert w.wakeup.run_once() == 0
    w.api.delete_pod("team-a", "a1")
    assert w.wakeup.run_once() == 1 and w.nudged() == ["team-a/a2"]


def test_nudges_are_rate_limited_and_checks_bounded_per_round() -> None:
    w = World([quota("team-a", hard={"wholeGpus": 0})], WakeSettings(rate_per_s=1.0, burst=1, checks_per_round=2))
    for i in range(3):
        assert not w.waiting(f"a{i}")
    w.quota("team-a", 4)
    assert w.wakeup.run_once() == 1  # two checked, both fit, one token
    assert w.wakeup.stats["checked"] == 2
    w.clock += 1.0
    assert w.wakeup.run_once() == 1  # the second due, and the third checked
    w.clock += 1.0
    assert w.wakeup.run_once() == 1
    assert w.nudged() == ["team-a/a0", "team-a/a1", "team-a/a2"]


def test_remembered_pods_are_bounded_and_expire() -> None:
    w = World([quota("team-a", hard={"wholeGpus": 0})], WakeSettings(max_tracked=2, ttl_s=60))
    for i in range(3):
        assert not w.waiting(f"a{i}")
    assert w.wakeup.tracked() == 2 and w.wakeup.stats["dropped"] == 1
    w.clock += 61
    w.wakeup.run_once()
    assert w.wakeup.tracked() == 0


def test_a_new_leader_adopts_the_waiting_pods_and_nudges_those_a_change_it_never_saw_lets_fit() -> None:
    w = World([quota("team-a", hard={"wholeGpus": 0}), quota("team-b", hard={"wholeGpus": 0})])
    assert not w.waiting("a1") and not w.waiting("b1", "team-b")
    w.quota("team-a", 1)  # the old leader dies before its next round: a1 is never nudged by it
    successor = PendingWakeUp(w.api, w.cache, w.service.fits_somewhere, pending=cache_pending(w.cache),
                              clock=lambda: w.clock)
    assert successor.run_once() == 0 and successor.tracked() == 0  # it filed nothing itself
    assert successor.adopt(w.api.list_pods(), filter_arguments(w.cache)) == 2
    assert successor.run_once() == 1 and w.nudged() == ["team-a/a1"]  # checked at once, not at a change
    assert successor.tracked() == 1  # b1 still refused: waits for a change
    w.quota("team-b", 1)
    assert successor.run_once() == 1 and w.nudged() == ["team-a/a1", "team-b/b1"]


def test_adoption_skips_bound_unknown_filed_and_untranslatable_pods() -> None:
    w = World([quota("team-a", hard={"wholeGpus": 0})])
    assert not w.waiting("a1") and not w.waiting("a2")
    w.api.bind_pod("team-a", "a2", w.api.get_pod("team-a", "a2")["metadata"]["uid"], "N1")
    stranger = gpu_pod("unknown", "team-a", whole=1)  # never seen by the watch
    stranger["metadata"]["uid"] = "uid-unknown"
    broken = w.api.create_pod(gpu_pod("broken", "team-a", whole=1))

    def describe(pod: Any) -> Any:
        if pod["metadata"]["name"] == "broken":
            raise TranslationError("gpupool.io/gpu-mem: not a number")
        return filter_arguments(w.cache)(pod)

    pods = [*w.api.list_pods(), stranger]
    assert broken in pods and w.wakeup.tracked() == 2  # a1 and a2, filed by the filter
    assert w.wakeup.adopt(pods, describe) == 0  # a1 filed already, a2 bound, stranger unknown, broken refused
    assert w.wakeup.tracked() == 2 and w.wakeup.stats["adopted"] == 0
