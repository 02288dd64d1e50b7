"""Leadership hand-over on the in-process fake API: a new leader binds only once its ledger has the
previous leader's last bookings, and an old leader whose term ended mid-bind writes nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpupool.api.annotations import decode_assignment
from gpupool.core.model import Placement, PodRequest
from gpupool.core.scheduler import Unschedulable
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.handover import CATCHING_UP, LOST_DURING_BIND, NOT_LEADING, Handover
from gpupool.extender.lease import LeaderElector, LeaseSettings
from gpupool.extender.service import ExtenderService
from gpupool.extender.watch import apply_pod_event
from gpupool.kube.listwatch import ListWatch
from gpupool.kube.tenancy import PodTenancy
from gpupool.testing.fake_api import FakePodApi
from gpupool.testing.fake_watch import FakeListWatch
from tests.extender.lease_fakes import FakeClock, FakeCoordination
from tests.kube.builders import container, node, pod


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


SETTINGS = LeaseSettings(namespace="default")  # the defaults: 10 s lease, 6 s renew deadline, 1 s retry
ASSIGNMENT = "gpupool.io/assignment-v1"
CARDS = [16276, 16276]


class Replica:
    """One extender replica: its own watch-fed cache, elector, hand-over fence, binder and service.

    The catch-up a new term starts is queued in :attr:`pending` and run when the test says so."""

    def __init__(self, name: str, api: FakePodApi, server: FakeListWatch, leases: FakeCoordination,
                 clock: FakeClock) -> None:
        self.api = api
        self.cache = ClusterCache(policy="binpack")
        self.cache.replace_nodes([node("n1", CARDS)])
        self.stop = threading.Event()
        self.watch = ListWatch("pods", server.list_pod_for_all_namespaces, self.cache.replace_pods,
                               lambda kind, obj: apply_pod_event(self.cache, kind, obj), stop=self.stop,
                               watch_timeout_s=1, backoff_s=0.05)
        self.pending: list[Callable[[], None]] = []
        self.elector = LeaderElector(leases, name, SETTINGS, monotonic=clock.monotonic, wall=clock.wall)
        self.handover = Handover(self.elector, self.watch.catch_up, stop=self.stop, retry_s=0.0,
                                 spawn=self.pending.append)
        self.elector.on_started_leading = self.handover.started_leading
        self.binder = Binder(self.cache, api, fence=self.handover)
        self.service = ExtenderService(self.cache, self.binder, is_leader=self.elector.is_leader,
                                       leader_name=self.elector.holder)

    def catch_up(self) -> None:
        while self.pending:
            self.pending.pop(0)()

    def bind(self, name: str) -> Any:
        return self.service.bind("default", name, f"uid-default-{name}", "n1")

    def free_mib(self) -> list[int]:
        return [u.memory_free for u in self.cache.state.card_usage("n1")]


class Cluster:
    def __init__(self) -> None:
        self.api = FakePodApi()
        self.server = FakeListWatch(self.api)
        self.leases = FakeCoordination()
        self.clock = FakeClock()
        self.replicas: list[Replica] = []

    def replica(self, name: str) -> Replica:
        r = Replica(name, self.api, self.server, self.leases, self.clock)
        r.watch.start()
        eventually(lambda: r.cache.synced)
        self.replicas.append(r)
        return r

    def create(self, name: str, mib: int) -> None:
        self.api.create_pod(pod(name, container(mib=mib)))

    def card_use(self) -> dict[int, int]:
        used: dict[int, int] = {}
        for p in self.api.list_pods():
            text = (p["metadata"].get("annotations") or {}).get(ASSIGNMENT)
            if text:
                for c in decode_assignment(text).containers:
                    for ref in c.cards:
                        used[ref.index] = used.get(ref.index, 0) + ref.memory_mib
        return used


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    for r in c.replicas:
        r.stop.set()
    c.server.hold_watches()
    c.server.release_watches()
    for r in c.replicas:
        r.watch.thread.join(timeout=10)


def test_a_new_leader_refuses_binds_until_caught_up_then_avoids_the_taken_slice(cluster: Cluster) -> None:
    a, b = cluster.replica("a"), cluster.replica("b")
    cluster.create("p1", 10000)
    cluster.create("p2", 10000)
    eventually(lambda: {"default/p1", "default/p2"} <= set(a.cache.pods) & set(b.cache.pods))
    assert a.elector.try_acquire_or_renew() and not b.elector.try_acquire_or_renew()
    assert a.bind("p1").error == CATCHING_UP  # even the first leader catches up first
    a.catch_up()

    cluster.server.hold_watches()  # b's watch lags from here on
    assert a.bind("p1").ok
    assert a.free_mib() == [6276, 16276]
    assert b.free_mib() == [16276, 16276]  # b's ledger lacks a's last booking

    cluster.clock.advance(16)  # a stopped renewing; b may take over
    assert not a.elector.is_leader()
    assert b.elector.try_acquire_or_renew() and b.elector.leading_term() == 1
    refused = b.bind("p2")
    assert refused.error == CATCHING_UP
    assert "patch default/p2" not in cluster.api.calls
    assert b.service.bind("default", "p2", "", "n1").error == CATCHING_UP  # through the service too

    b.catch_up()  # the quorum list: a's booking is in b's ledger now, though its watch still lags
    assert b.free_mib() == [6276, 16276]
    result = b.bind("p2")
    assert result.ok, result.error
    assert isinstance(result.placement, Placement)
    assert result.placement.containers[0].cards == (1,)  # not the slice a gave to p1
    assert cluster.card_use() == {0: 10000, 1: 10000}

    cluster.create("p3", 1000)
    assert not a.bind("p3").ok  # the old leader binds nothing any more
    cluster.server.release_watches()
    eventually(lambda: a.cache.pods.get("default/p3") is not None)


def leader_with_pending_pod(cluster: Cluster) -> Replica:
    """Replica "a", leading and caught up, with pod ``p1`` (10,000 MiB) in its cache, not yet bound."""
    a = cluster.replica("a")
    cluster.create("p1", 10000)
    eventually(lambda: "default/p1" in a.cache.pods)
    assert a.elector.try_acquire_or_renew()
    a.catch_up()
    return a


def test_an_old_leader_whose_deadline_passes_mid_bind_writes_no_assignment(cluster: Cluster) -> None:
    a = leader_with_pending_pod(cluster)
    reserve = a.cache.reserve

    def slow_reserve(request: PodRequest, node_name: str,
                     tenant: PodTenancy | None = None, uid: str = "") -> Placement | Unschedulable:
        decision = reserve(request, node_name, tenant, uid)
        cluster.clock.advance(10.5)  # a long pause: the renew deadline passes before the write
        return decision

    a.cache.reserve = slow_reserve  # type: ignore[method-assign]
    result = a.bind("p1")
    assert result.error == LOST_DURING_BIND
    assert not any(call.startswith("patch") for call in cluster.api.calls)
    assert ASSIGNMENT not in (cluster.api.get_pod("default", "p1")["metadata"].get("annotations") or {})
    assert a.free_mib() == [16276, 16276]  # the reservation was rolled back
    assert not a.cache.in_flight()


def test_a_bind_begun_in_an_earlier_term_writes_nothing_even_if_leading_again(cluster: Cluster) -> None:
    """Lost and won again mid-bind: another leader may have booked meanwhile, so the ticket of the
    old term is void; the new term binds only after its own catch-up."""
    a = leader_with_pending_pod(cluster)
    reserve = a.cache.reserve

    def lapse_and_return(request: PodRequest, node_name: str,
                         tenant: PodTenancy | None = None, uid: str = "") -> Placement | Unschedulable:
        decision = reserve(request, node_name, tenant, uid)
        cluster.clock.advance(11)
        assert a.elector.try_acquire_or_renew() and a.elector.leading_term() == 2
        return decision

    a.cache.reserve = lapse_and_return  # type: ignore[method-assign]
    assert a.bind("p1").error == LOST_DURING_BIND
    a.cache.reserve = reserve  # type: ignore[method-assign]
    assert a.bind("p1").error == CATCHING_UP
    a.catch_up()
    assert a.bind("p1").ok


def test_a_failing_catch_up_keeps_refusing_and_gives_up_when_the_term_ends() -> None:
    clock, leases = FakeClock(), FakeCoordination()
    elector = LeaderElector(leases, "a", SETTINGS, monotonic=clock.monotonic, wall=clock.wall)
    calls: list[int] = []

    def catch_up() -> None:
        calls.append(1)
        if len(calls) == 3:
            clock.advance(11)  # the term ends while the API is still failing
        raise RuntimeError("apiserver unavailable")

    pending: list[Callable[[], None]] = []
    handover = Handover(elector, catch_up, retry_s=0.0, spawn=pending.append)
    elector.on_started_leading = handover.started_leading
    assert elector.try_acquire_or_renew()
    assert handover.refusal() == CATCHING_UP and handover.admit() is None
    pending.pop()()
    assert len(calls) == 3  # retried while leading, stopped once the term was over
    assert handover.admit() is None and handover.refusal() == NOT_LEADING


def test_listeners_hear_a_term_caught_up_and_one_failing_does_not_close_it() -> None:
    clock, leases = FakeClock(), FakeCoordination()
    elector = LeaderElector(leases, "a", SETTINGS, monotonic=clock.monotonic, wall=clock.wall)
    pending: list[Callable[[], None]] = []
    handover = Handover(elector, lambda: None, spawn=pending.append)
    heard: list[str] = []

    def failing() -> None:
        heard.append("failing")
        raise RuntimeError("listing the waiting pods failed")

    handover.caught_up_listeners += [failing, lambda: heard.append("wake-up")]
    elector.on_started_leading = handover.started_leading
    assert elector.try_acquire_or_renew()
    assert heard == []  # not before the ledger caught up
    pending.pop()()
    assert heard == ["failing", "wake-up"]
    assert handover.admit() is not None and handover.refusal() == ""
