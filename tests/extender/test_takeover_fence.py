"""A new leader fences the waiting GPU pods, so a bind its cut-off predecessor sent before stepping
down and that reaches the apiserver late is refused instead of double-booking a card."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gpupool.extender.takeover_fence import CHANGED, FENCED, GONE, FenceFailed, TakeoverFence, wants_gpu
from gpupool.kube.podapi import ApiError, ConflictError, NoAnswerError, NotFoundError
from gpupool.testing.fake_api import FakePodApi
from tests.extender.test_handover import Cluster, eventually
from tests.extender.test_handover import cluster as cluster  # the fixture, re-exported
from tests.kube.builders import container, pod

CARD_MIB = 16276


class HeldWrites:
    """The old leader's view of the API across a partition: its Bindings never get an answer, and
    each is kept to reach the apiserver later (TCP retransmits it once the path is back)."""

    def __init__(self, api: FakePodApi) -> None:
        self.api = api
        self.held: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)

    def bind_pod(self, *args: Any, **kwargs: Any) -> None:
        self.held.append((args, kwargs))
        raise NoAnswerError("read timed out", 0)

    def deliver(self) -> list[str]:
        """The held writes arrive; how each was answered."""
        answers = []
        for args, kwargs in self.held:
            try:
                self.api.bind_pod(*args, **kwargs)
                answers.append("bound")
            except ConflictError:
                answers.append("409")
        return answers


def waiting(api: FakePodApi) -> list[dict[str, Any]]:
    return [p for p in api.list_pods() if not p["spec"].get("nodeName")]


@pytest.mark.parametrize("fenced", [True, False])
def test_a_late_bind_of_the_cut_leader_is_refused_after_the_new_leader_fenced(
        cluster: Cluster, fenced: bool) -> None:
    a, b = cluster.replica("a"), cluster.replica("b")
    if fenced:
        b.handover.fence = TakeoverFence(cluster.api, lambda: waiting(cluster.api), wants_gpu(b.cache.requests),
                                         "b", "gpupool.io")
    cluster.create("p1", 10000)
    cluster.create("p2", 10000)
    eventually(lambda: {"default/p1", "default/p2"} <= set(a.cache.pods) & set(b.cache.pods))
    assert a.elector.try_acquire_or_renew() and not b.elector.try_acquire_or_renew()
    a.catch_up()

    partition = HeldWrites(cluster.api)
    a.binder.api = partition
    assert not a.bind("p1").ok  # no answer: card 0 stays booked in a's ledger only
    assert len(partition.held) == 1

    cluster.clock.advance(16)  # a could not renew: its deadline passed, b's look at the Lease expired
    assert not a.elector.is_leader()
    assert b.elector.try_acquire_or_renew()
    b.catch_up()
    result = b.bind("p2")
    assert result.ok, result.error
    assert cluster.card_use() == {0: 10000}  # b put p2 on card 0: a's booking of it never landed

    answers = partition.deliver()  # the path heals: a's Binding of p1 reaches the apiserver
    if fenced:
        assert answers == ["409"]  # p1 changed since a read it: the fence
        assert cluster.card_use() == {0: 10000}
        assert (cluster.api.get_pod("default", "p1")["metadata"]["annotations"]["gpupool.io/leader-term"]
                .startswith("b term 1 "))
    else:  # what the fence prevents: p1 bound with a's stale choice, card 0 over its memory
        assert answers == ["bound"]
        assert cluster.card_use() == {0: 20000}


class Answering(FakePodApi):
    """Patches answered as told per pod name: "409", "404", "fail", else done."""

    def __init__(self, answers: Mapping[str, str]) -> None:
        super().__init__()
        self.answers = answers

    def patch_pod_annotations(self, namespace: str, name: str, resource_version: str,
                              annotations: dict[str, str | None]) -> dict[str, Any]:
        answer = self.answers.get(name, "")
        if answer == "409":
            raise ConflictError("changed", 409)
        if answer == "404":
            raise NotFoundError("gone", 404)
        if answer == "fail":
            raise ApiError("the apiserver is overloaded", 429)
        return super().patch_pod_annotations(namespace, name, resource_version, annotations)


def fence_over(api: FakePodApi) -> TakeoverFence:
    return TakeoverFence(api, lambda: waiting(api), lambda p: p["metadata"]["name"] != "cpu-only", "replica-b",
                         "gpupool.io")


def test_each_waiting_gpu_pod_gets_a_new_value_under_its_listed_version() -> None:
    api = Answering({})
    for name in ("p1", "p2", "cpu-only"):
        api.create_pod(pod(name, container(mib=1000)))
    fence = fence_over(api)
    before = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in api.list_pods()}
    fence(3)
    assert fence.last == {FENCED: 2}
    after = {p["metadata"]["name"]: p for p in api.list_pods()}
    for name in ("p1", "p2"):
        assert after[name]["metadata"]["resourceVersion"] != before[name]
        assert after[name]["metadata"]["annotations"]["gpupool.io/leader-term"].startswith("replica-b term 3 ")
    assert after["cpu-only"]["metadata"]["resourceVersion"] == before["cpu-only"]  # not gpupool's to bind
    first = after["p1"]["metadata"]["annotations"]["gpupool.io/leader-term"]
    fence(4)  # the next term changes the pod again, even with the same identity
    assert api.get_pod("default", "p1")["metadata"]["annotations"]["gpupool.io/leader-term"] != first


def test_a_pod_changed_or_gone_since_the_list_is_fenced_already_a_failure_keeps_the_term_closed() -> None:
    api = Answering({"p1": "409", "p2": "404"})
    for name in ("p1", "p2", "p3"):
        api.create_pod(pod(name, container(mib=1000)))
    fence = fence_over(api)
    fence(1)
    assert fence.last == {CHANGED: 1, GONE: 1, FENCED: 1}
    failing = fence_over(Answering({"p2": "fail"}))
    for name in ("p1", "p2"):
        failing.api.create_pod(pod(name, container(mib=1000)))  # type: ignore[attr-defined]
    with pytest.raises(FenceFailed, match="1 of 2 waiting GPU pods"):
        failing(1)


def test_the_hand_over_opens_no_term_until_the_fence_held() -> None:
    from gpupool.extender.handover import CATCHING_UP, Handover
    from gpupool.extender.lease import LeaderElector, LeaseSettings
    from tests.extender.lease_fakes import FakeClock, FakeCoordination

    clock, leases = FakeClock(), FakeCoordination()
    elector = LeaderElector(leases, "b", LeaseSettings(namespace="default"), monotonic=clock.monotonic,
                            wall=clock.wall)
    order: list[str] = []
    tries = iter([FenceFailed("1 of 1 waiting GPU pods could not be fenced"), None])

    def fence(term: int) -> None:
        order.append(f"fence {term}")
        error = next(tries)
        if error is not None:
            raise error

    pending: list[Any] = []
    handover = Handover(elector, lambda: order.append("list"), retry_s=0.0, spawn=pending.append, fence=fence)
    elector.on_started_leading = handover.started_leading
    assert elector.try_acquire_or_renew()
    assert handover.refusal() == CATCHING_UP
    pending.pop()()
    assert order == ["fence 1", "fence 1", "list"]  # retried; the catch-up list comes after the fence
    assert handover.admit() == 1


def test_only_pods_gpupool_binds_with_an_assignment_are_fenced() -> None:
    from gpupool.api.names import ResourceNames
    from gpupool.extender.request_memo import RequestMemo

    check = wants_gpu(RequestMemo(ResourceNames()))
    assert check(pod("gpu", container(mib=1000)))
    assert not check(pod("cpu-only", container(cpu="1")))
    assert not check(pod("unreadable", container(gpu_mem="lots")))  # no leader binds it with cards
