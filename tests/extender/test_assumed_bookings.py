"""The filter books what it decides: an answer that passes one node books the pod's cards there as
``ASSUMED`` until its bind, as kube-scheduler's own cache assumes a pod.

The life of an assumption: taken over by the pod's bind on its node (those very cards), ended by a
bind elsewhere or a refused one, replaced by a later filter of the pod, ended by the pod's end, by
a claim of the cluster that needs its cards, or by its deadline. It is kept in memory only: a
restarted extender, or the replica that takes over, has none, and binds as before (below).
"""

from __future__ import annotations

import threading
from typing import Any

from gpupool.core.model import PodRequest
from gpupool.extender.binder import Binder
from gpupool.extender.booking_keeper import ASSUMED_CONFLICT, ASSUMED_EXPIRED, ASSUMED_MOVED, ASSUMED_POD_ENDED
from gpupool.extender.bookings import Stage
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import DEFAULT_ASSUME_S, ExtenderService, ExtenderSettings
from gpupool.extender.wakeup import loosening_signature
from gpupool.kube.translate import pod_request
from gpupool.testing.fake_api import FakePodApi
from tests.extender.binder_world import usage_from_annotations
from tests.extender.modes import SHIPPED
from tests.kube.builders import container, node, placed_pod, pod

NAMES = [f"node-{i}" for i in range(4)]
RANK = {"node-0": 30, "node-1": 20, "node-2": 40, "node-3": 10}
"""The fixed node order of these tests: node-3, node-1, node-0, node-2."""
CARD = 16384
SHIPPED_IN_ORDER = ExtenderSettings(tie_rank=RANK.__getitem__)
"""The shipped mode, with a node order the tests know."""


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class World:
    """Nodes of one 16 GiB card on a fake API whose changes reach the cache as the watch's would."""

    def __init__(self, names: list[str] = NAMES, settings: ExtenderSettings = SHIPPED_IN_ORDER) -> None:
        self.clock = Clock()
        self.api = FakePodApi()
        self.cache = ClusterCache(policy="binpack", clock=self.clock)
        self.cache.replace_nodes([node(name, [CARD]) for name in names])
        self.cache.replace_pods([])
        self.api.listeners.append(
            lambda kind, p: self.cache.remove_pod(p) if kind == "DELETED" else self.cache.upsert_pod(p))
        self.service = ExtenderService(self.cache, Binder(self.cache, self.api), settings=settings)

    def create(self, name: str, mib: int = CARD) -> dict[str, Any]:
        return self.api.create_pod(pod(name, container(mib=mib)))

    def filter(self, obj: dict[str, Any], names: list[str] = NAMES) -> list[str]:
        outcome = self.service.filter(self.request(obj), names, pod=obj)
        assert outcome.error == ""
        return outcome.passed

    def request(self, obj: dict[str, Any]) -> PodRequest:
        return pod_request(obj, self.cache.names)

    def bind(self, obj: dict[str, Any], node_name: str) -> str:
        meta = obj["metadata"]
        return self.service.bind(meta["namespace"], meta["name"], meta["uid"], node_name).error

    def stage(self, name: str) -> Stage | None:
        booking = self.cache.bookings.get(f"default/{name}")
        return booking.stage if booking is not None else None


def test_the_default_deadline_is_a_little_above_kube_schedulers_http_timeout() -> None:
    """deploy/ gives kube-scheduler httpTimeout: 10s; a bind of the decision comes within it."""
    assert SHIPPED.assume_s == DEFAULT_ASSUME_S and 10.0 < DEFAULT_ASSUME_S <= 15.0


def test_an_assumption_keeps_its_node_from_the_next_pod_until_its_deadline() -> None:
    world = World()
    p1, p2, p3 = world.create("p1"), world.create("p2"), world.create("p3")
    assert world.filter(p1) == ["node-3"]
    world.clock.now += DEFAULT_ASSUME_S - 0.1
    assert world.filter(p2) == ["node-1"]  # node-3 still held for p1's bind
    world.clock.now += 0.2  # p1's deadline passed, p2's not
    assert world.filter(p3) == ["node-3"]
    assert world.stage("p1") is Stage.NONE and world.stage("p2") is Stage.ASSUMED
    assert world.cache.assumption_ends[ASSUMED_EXPIRED] == 1


def test_housekeeping_ends_a_lapsed_assumption_without_a_filter() -> None:
    world = World()
    assert world.filter(world.create("p1")) == ["node-3"]
    world.clock.now += DEFAULT_ASSUME_S + 1
    assert world.cache.expire() == ["default/p1"]
    assert "default/p1" not in world.cache.state.placements and world.cache.assumed_pods == 0


def test_the_deadline_is_a_setting() -> None:
    world = World(settings=ExtenderSettings(tie_rank=RANK.__getitem__, assume_s=1.0))
    assert world.filter(world.create("p1")) == ["node-3"]
    world.clock.now += 1.0
    assert world.filter(world.create("p2")) == ["node-3"]


def test_the_bind_takes_over_the_assumed_cards_and_is_never_refused_for_its_own_assumption() -> None:
    """node-3 is the only node with room: the pod's own assumption fills it, and its bind there
    must still succeed, with those very cards."""
    world = World()
    for name in NAMES[:3]:
        world.cache.upsert_pod(placed_pod(f"owner-{name}", name, 0, CARD))
    p1 = world.create("p1", 8192)
    assert world.filter(p1) == ["node-3"]
    assumed = world.cache.state.placements["default/p1"]
    assert world.bind(p1, "node-3") == ""
    assert world.cache.state.placements["default/p1"] == assumed
    assert world.stage("p1") in (Stage.PINNED, Stage.BOUND)
    assert world.cache.assumption_ends["reserved"] == 1


def test_a_bind_to_another_node_releases_the_assumed_one() -> None:
    world = World()
    p1, p2 = world.create("p1"), world.create("p2")
    assert world.filter(p1) == ["node-3"]
    assert world.bind(p1, "node-1") == ""  # kube-scheduler could only pick node-3; the bind decides anyway
    assert world.cache.state.placements["default/p1"].node == "node-1"
    assert world.cache.assumption_ends[ASSUMED_MOVED] == 1
    assert world.filter(p2) == ["node-3"]  # node-3 is free again


def test_a_second_filter_of_the_same_pod_replaces_its_assumption() -> None:
    """A one-card node the pod filled: its second filter must not see its own first choice."""
    world = World()
    p1 = world.create("p1")
    assert world.filter(p1) == ["node-3"]
    assert world.filter(p1) == ["node-3"]
    assert world.filter(p1, ["node-0", "node-3"]) == ["node-3"]
    assert world.filter(p1, ["node-0"]) == ["node-0"]  # asked elsewhere: node-3 is released
    assert [k for k, p in world.cache.state.placements.items() if p.node == "node-3"] == []
    assert world.cache.assumed_pods == 1


def test_a_filter_that_passes_no_node_or_several_assumes_nothing() -> None:
    world = World(settings=ExtenderSettings(filter_best_only=False))  # not the default: every node that fits
    p1 = world.create("p1")
    assert world.filter(p1) == NAMES and world.cache.assumed_pods == 0
    assert world.filter(p1, ["node-2"]) == ["node-2"] and world.cache.assumed_pods == 1
    assert world.filter(world.create("big", 2 * CARD)) == [] and world.cache.assumed_pods == 1


def test_a_pending_pod_seen_by_the_watch_keeps_its_assumption_and_a_deleted_one_ends_it() -> None:
    """The watch's events of a pending pod (it may arrive after its filter) say it holds nothing:
    that is what an assumed pod is. Deleted, it frees its cards."""
    world = World()
    late = pod("late", container(mib=CARD))
    late["metadata"]["uid"] = "uid-late"
    assert world.filter(late) == ["node-3"]  # the watch has not delivered it yet
    world.cache.upsert_pod(late)
    assert world.stage("late") is Stage.ASSUMED
    world.cache.remove_pod(late)
    assert world.stage("late") is None and "default/late" not in world.cache.state.placements
    assert world.cache.assumption_ends[ASSUMED_POD_ENDED] == 1


def test_a_pod_deleted_through_the_api_frees_its_assumed_node() -> None:
    world = World()
    p1 = world.create("p1")
    assert world.filter(p1) == ["node-3"]
    world.api.delete_pod("default", "p1")
    assert world.filter(world.create("p2")) == ["node-3"]


def test_a_finished_pod_ends_its_assumption() -> None:
    world = World()
    p1 = world.create("p1")
    assert world.filter(p1) == ["node-3"]
    p1["status"] = {"phase": "Failed"}
    p1["metadata"]["resourceVersion"] = "2"
    world.cache.upsert_pod(p1)
    assert "default/p1" not in world.cache.state.placements


def test_a_claim_of_the_cluster_takes_the_assumed_cards_without_an_over_commitment() -> None:
    """Another writer (a replica during a fail-over) bound a pod onto the card node-3's assumption
    holds: the cluster's claim wins, the assumption ends, and no card is reported over-committed."""
    world = World()
    assert world.filter(world.create("p1")) == ["node-3"]
    world.cache.upsert_pod(placed_pod("elsewhere", "node-3", 0, CARD))
    assert "default/p1" not in world.cache.state.placements
    assert world.cache.overcommitted_cards() == 0 and world.cache.take_notices() == []
    assert world.cache.assumption_ends[ASSUMED_CONFLICT] == 1


def test_after_a_fail_over_the_new_leader_has_no_assumption_and_binds_from_its_ledger() -> None:
    """Assumptions are in memory only. The replica that takes over (or the extender restarted)
    has none for the pods the old leader filtered: their binds reserve from its ledger as a bind
    without a filter does, so a pod whose node still has room is bound there, and one whose node
    was filled meanwhile is refused (kube-scheduler filters it again) rather than double-booked.
    The old leader's assumptions end when its watch shows the pods bound, or at their deadline."""
    old = World()
    p1, p2 = old.create("p1"), old.create("p2")
    assert old.filter(p1) == ["node-3"]
    new = World()  # the other replica: the same API objects, a ledger of its own
    new.api = old.api
    new.service = ExtenderService(new.cache, Binder(new.cache, old.api), settings=SHIPPED_IN_ORDER)
    new.cache.replace_pods(old.api.list_pods())
    assert new.cache.assumed_pods == 0
    assert new.filter(p2) == ["node-3"]  # the new leader's ledger does not hold p1's choice
    assert new.bind(p2, "node-3") == ""
    assert "does not fit" in new.bind(p1, "node-3")  # refused, not over-committed
    assert new.bind(p1, "node-1") == ""  # kube-scheduler's next cycle
    assert usage_from_annotations(old.api) == {("node-3", 0): CARD, ("node-1", 0): CARD}
    old.cache.upsert_pod(old.api.get_pod("default", "p1"))  # the old leader's watch
    assert old.stage("p1") is Stage.BOUND and old.cache.assumed_pods == 0


def test_many_filters_at_once_never_hand_out_a_card_twice() -> None:
    """Eight threads filter 64 pods over 16 one-card nodes before any bind: each node is passed to
    one pod only (the filter used to pass an in-flight node again once none was left), and every
    pod passed a node binds there."""
    names = [f"node-{i:02d}" for i in range(16)]
    world = World(names, settings=SHIPPED)
    pods = [world.create(f"p{i:02d}") for i in range(64)]
    answers: dict[str, list[str]] = {}
    lock = threading.Lock()

    def filter_some(chunk: list[dict[str, Any]]) -> None:
        for obj in chunk:
            got = world.filter(obj, names)
            with lock:
                answers[obj["metadata"]["name"]] = got

    threads = [threading.Thread(target=filter_some, args=(pods[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    placed = {name: got[0] for name, got in answers.items() if got}
    assert sorted(placed.values()) == names  # every node once, no node twice
    assert world.cache.assumed_pods == 16
    for obj in pods:
        name = obj["metadata"]["name"]
        if name in placed:
            assert world.bind(obj, placed[name]) == ""
    assert world.cache.assumed_pods == 0
    assert all(mib <= CARD for mib in usage_from_annotations(world.api).values())


def test_an_assumption_that_ends_without_its_bind_wakes_the_refused_pods() -> None:
    """kube-scheduler never saw the space an assumption held being taken: its end moves the
    wake-up's signature, so pods refused meanwhile are checked again."""
    world = World(["node-3"])
    p1 = world.create("p1")
    assert world.filter(p1, ["node-3"]) == ["node-3"]
    with world.cache.lock:
        before = loosening_signature(world.cache, lambda _: {})
    assert world.filter(world.create("p2"), ["node-3"]) == []  # refused: node-3 is held for p1
    world.clock.now += DEFAULT_ASSUME_S + 1
    world.cache.expire()
    with world.cache.lock:
        assert loosening_signature(world.cache, lambda _: {}) != before
