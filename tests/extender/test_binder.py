"""Binding: exact cards recorded on the pod, races for the last slice, 409s, rollback, restart rebuild."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import pytest

from gpupool.api.annotations import decode_assignment
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.kube.podapi import ApiError, NoAnswerError
from tests.extender.binder_world import ASSIGNMENT, WRITES, free_mib, usage_from_annotations, world
from tests.kube.builders import container, node, placed_pod, pod


@pytest.mark.parametrize("one_write", WRITES)
def test_bind_records_the_exact_cards_then_binds(one_write: bool) -> None:
    api, cache, binder = world([node("n1", [16276, 16276])], one_write=one_write)
    api.create_pod(pod("p", container(mib=8138)))
    result = binder.bind("default", "p", "uid-default-p", "n1")
    assert result.ok, result.error
    # The watch's copy saved the GET; the Binding carries the assignment where it can.
    writes = ["bind default/p n1"] if one_write else ["patch default/p", "bind default/p n1"]
    assert api.calls == writes
    stored = api.get_pod("default", "p")
    assert stored["spec"]["nodeName"] == "n1"
    assignment = decode_assignment(stored["metadata"]["annotations"][ASSIGNMENT])
    assert assignment.node == "n1"
    ref = assignment.containers[0].cards[0]
    assert (ref.memory_mib, ref.compute, ref.uuid) == (8138, 0, f"GPU-n1-{ref.index}")
    assert sorted(free_mib(cache, "n1")) == [8138, 16276]


def test_binpack_picks_the_tightest_card() -> None:
    """Alibaba's example: cards with 12,207/8,138/4,069/16,276 MiB free; 8,138 MiB goes to GPU1."""
    api, cache, binder = world([node("n1", [16276] * 4)])
    for card, used in enumerate([4069, 8138, 12207]):
        api.create_pod(placed_pod(f"used{card}", "n1", card, used))
    assert free_mib(cache, "n1") == [12207, 8138, 4069, 16276]
    api.create_pod(pod("p", container(mib=8138)))
    result = binder.bind("default", "p", "uid-default-p", "n1")
    assert result.ok and result.placement is not None
    assert result.placement.containers[0].cards == (1,)
    assert free_mib(cache, "n1") == [12207, 0, 4069, 16276]


@pytest.mark.parametrize("one_write", WRITES)
def test_two_binds_for_the_last_slice_exactly_one_wins(one_write: bool) -> None:
    api, cache, binder = world([node("n1", [16276])], latency=0.005, one_write=one_write)
    api.create_pod(pod("first", container(mib=8138)))
    assert binder.bind("default", "first", "uid-default-first", "n1").ok
    for name in ("a", "b"):
        api.create_pod(pod(name, container(mib=8138)))
    barrier = threading.Barrier(2)
    results: dict[str, Any] = {}

    def run(name: str) -> None:
        barrier.wait()
        results[name] = binder.bind("default", name, f"uid-default-{name}", "n1")

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n, r in results.items() if r.ok]
    assert len(winners) == 1
    loser = next(r for r in results.values() if not r.ok)
    assert "no single card has 8138 MiB free; largest free 0 MiB" in loser.error
    assert usage_from_annotations(api) == {("n1", 0): 16276}
    assert free_mib(cache, "n1") == [0]


@pytest.mark.parametrize("one_write", WRITES)
def test_a_409_on_the_annotation_makes_the_bind_re_evaluate(one_write: bool) -> None:
    """While ``a`` writes its assignment, the pod changes and ``b`` takes the last slice: ``a`` gets a
    409, re-reads, re-evaluates and fails with the core's reason instead of over-committing."""
    api, cache, binder = world([node("n1", [16276])], one_write=one_write)
    api.create_pod(pod("first", container(mib=8138)))
    assert binder.bind("default", "first", "uid-default-first", "n1").ok
    api.create_pod(pod("a", container(mib=8138)))
    api.create_pod(pod("b", container(mib=8138)))
    b_results = []

    def competing_writer(namespace: str, name: str) -> None:
        api.touch_pod(namespace, name)
        cache.rollback(f"{namespace}/{name}")  # the slice is free while a's write is refused
        b_results.append(binder.bind("default", "b", "uid-default-b", "n1"))

    api.conflicts_to_inject = 1
    api.before_conflict = competing_writer
    result = binder.bind("default", "a", "uid-default-a", "n1")
    assert b_results[0].ok
    assert not result.ok and result.attempts == 2
    assert "no single card has 8138 MiB free" in result.error
    assert usage_from_annotations(api) == {("n1", 0): 16276}
    assert "spec" in api.get_pod("default", "a") and not api.get_pod("default", "a")["spec"].get("nodeName")


@pytest.mark.parametrize("one_write", WRITES)
def test_a_409_with_room_left_retries_and_succeeds(one_write: bool) -> None:
    api, cache, binder = world([node("n1", [16276])], one_write=one_write)
    api.create_pod(pod("a", container(mib=1000)))
    api.conflicts_to_inject = 2
    api.before_conflict = lambda ns, name: api.touch_pod(ns, name)
    result = binder.bind("default", "a", "uid-default-a", "n1")
    assert result.ok and result.attempts == 3
    assert free_mib(cache, "n1") == [15276]


@pytest.mark.parametrize("one_write", WRITES)
def test_the_same_pod_bound_by_two_replicas_gets_one_assignment(one_write: bool) -> None:
    """Replica B read the pod, then replica A bound it; B's write is refused (409), B reads the pod
    again, finds it bound where it was asked to bind it, and adopts A's assignment."""
    api, cache_a, binder_a = world([node("n1", [16276, 16276])], one_write=one_write)
    cache_b = ClusterCache(policy="binpack")
    cache_b.replace_nodes([node("n1", [16276, 16276])])
    cache_b.replace_pods([])
    api.listeners.append(lambda kind, p: cache_b.upsert_pod(p))
    api.create_pod(pod("p", container(mib=8000)))

    class Interleaved:
        """B's API: replica A binds the pod after B has read it and before B's write arrives."""

        done = False

        def get_pod(self, namespace: str, name: str, *, timeout_s: float | None = None) -> dict[str, Any]:
            return api.get_pod(namespace, name)

        def _a_binds_first(self, namespace: str, name: str) -> None:
            if not self.done:
                self.done = True
                assert binder_a.bind(namespace, name, f"uid-{namespace}-{name}", "n1").ok

        def patch_pod_annotations(self, namespace: str, name: str, *args: Any) -> dict[str, Any]:
            self._a_binds_first(namespace, name)
            return api.patch_pod_annotations(namespace, name, *args)

        def bind_pod(self, namespace: str, name: str, *args: Any, **binding: Any) -> None:
            self._a_binds_first(namespace, name)
            api.bind_pod(namespace, name, *args, **binding)

    result = Binder(cache_b, Interleaved(), annotate_in_binding=one_write).bind("default", "p", "uid-default-p", "n1")
    assert result.ok and result.attempts == 2
    pod_now = api.get_pod("default", "p")
    assert decode_assignment(pod_now["metadata"]["annotations"][ASSIGNMENT]).node == "n1"
    assert sorted(free_mib(cache_a, "n1")) == sorted(free_mib(cache_b, "n1")) == [8276, 16276]
    # Two writers, one pod: A's Binding; B's write (its PATCH, or its Binding) refused with 409.
    assert len([c for c in api.calls if c.startswith("bind")]) == (2 if one_write else 1)
    assert pod_now["spec"]["nodeName"] == "n1"


@pytest.mark.parametrize("one_write", WRITES)
def test_a_failed_binding_rolls_the_reservation_back(one_write: bool) -> None:
    api, cache, binder = world([node("n1", [16276])], one_write=one_write)
    api.create_pod(pod("p", container(mib=16000)))

    def broken(*_: Any, **__: Any) -> None:
        raise ApiError("apiserver unavailable", 503)

    api.bind_pod = broken  # type: ignore[method-assign]
    result = binder.bind("default", "p", "uid-default-p", "n1")
    assert not result.ok and "apiserver unavailable" in result.error
    assert free_mib(cache, "n1") == [16276]
    assert ASSIGNMENT not in api.get_pod("default", "p")["metadata"]["annotations"]
    assert cache.in_flight() == 0


def test_bind_errors_are_reported_not_raised() -> None:
    api, _cache, binder = world([node("n1", [16276])])
    assert "no longer exists" in binder.bind("default", "ghost", "uid-default-ghost", "n1").error
    api.create_pod(pod("big", container(mib=20000)))
    assert "largest card has 16276 MiB" in binder.bind("default", "big", "uid-default-big", "n1").error
    api.create_pod(pod("bad", container(mib="x")))
    assert "not a Kubernetes quantity" in binder.bind("default", "bad", "uid-default-bad", "n1").error
    api.create_pod(pod("other", container(mib=1)))
    assert "replaced" in binder.bind("default", "other", "wrong-uid", "n1").error
    assert "not known" in binder.bind("default", "other", "uid-default-other", "nowhere").error


def test_binding_a_pod_already_bound_there_is_idempotent() -> None:
    api, cache, binder = world([node("n1", [16276]), node("n2", [16276])])
    api.create_pod(pod("p", container(mib=100)))
    assert binder.bind("default", "p", "uid-default-p", "n1").ok
    assert binder.bind("default", "p", "uid-default-p", "n1").ok
    assert "already bound to node n1" in binder.bind("default", "p", "uid-default-p", "n2").error
    assert free_mib(cache, "n1") == [16176]


def test_restart_rebuilds_every_reservation_from_annotations() -> None:
    nodes = [node(f"n{i}", [16276, 16276, 8000]) for i in range(4)]
    api, cache, binder = world(nodes)
    rng = random.Random(7)
    for i in range(40):
        api.create_pod(pod(f"p{i}", container(mib=rng.choice([1000, 2000, 4069, 8138]))))
        binder.bind("default", f"p{i}", f"uid-default-p{i}", f"n{rng.randrange(4)}")
    api.create_pod(pod("whole", container(gpu=1)))
    binder.bind("default", "whole", "uid-default-whole", "n0")
    restarted = ClusterCache(policy="binpack")
    restarted.replace_pods(api.list_pods())  # pods before nodes: bookings wait for their node
    restarted.replace_nodes(nodes)
    assert restarted.synced
    assert restarted.state.placements == cache.state.placements
    for n in nodes:
        name = n["metadata"]["name"]
        assert [u.memory_free for u in restarted.state.card_usage(name)] == free_mib(cache, name)
        assert [u.mode for u in restarted.state.card_usage(name)] == [
            u.mode for u in cache.state.card_usage(name)
        ]
    assert not restarted.conflicts


def test_unbound_assignments_expire_but_bound_ones_stay() -> None:
    now = [1_000_000.0]
    cache = ClusterCache(policy="binpack", unconfirmed_timeout_s=60, clock=lambda: now[0])
    cache.replace_nodes([node("n1", [16276])])
    cache.replace_pods(
        [
            placed_pod("unbound", "n1", 0, 4000, bound=False, when=now[0]),
            placed_pod("bound", "n1", 0, 4000, when=now[0]),
        ]
    )
    assert free_mib(cache, "n1") == [16276 - 8000]
    now[0] += 61
    assert cache.expire() == ["default/unbound"]
    assert free_mib(cache, "n1") == [16276 - 4000]
    done = placed_pod("bound", "n1", 0, 4000, when=now[0])
    done["status"]["phase"] = "Succeeded"
    cache.upsert_pod(done)
    assert free_mib(cache, "n1") == [16276]


def test_confirmed_assignments_do_not_expire() -> None:
    now = [1_000_000.0]
    cache = ClusterCache(unconfirmed_timeout_s=60, clock=lambda: now[0])
    cache.replace_nodes([node("n1", [16276])])
    confirmed = placed_pod("p", "n1", 0, 4000, bound=False, when=now[0])
    confirmed["metadata"]["annotations"]["gpupool.io/allocated-v1"] = json.dumps(
        {"v": 1, "node": "n1", "time": "2024-05-01T00:00:00Z"}
    )
    cache.replace_pods([confirmed])
    now[0] += 3600
    assert cache.expire() == []
    assert free_mib(cache, "n1") == [12276]


@pytest.mark.parametrize("one_write", WRITES)
def test_many_concurrent_binds_never_over_commit(one_write: bool) -> None:
    nodes = [node(f"n{i}", [16276, 16276]) for i in range(3)]
    api, cache, binder = world(nodes, latency=0.001, one_write=one_write)
    rng = random.Random(3)
    names = [f"p{i}" for i in range(60)]
    for name in names:
        api.create_pod(pod(name, container(mib=rng.choice([2000, 4069, 8138]))))
    outcomes: list[bool] = []

    def worker(chunk: list[str]) -> None:
        for name in chunk:
            outcomes.append(binder.bind("default", name, f"uid-default-{name}", f"n{rng.randrange(3)}").ok)

    threads = [threading.Thread(target=worker, args=(names[i::6],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    used = usage_from_annotations(api)
    assert all(v <= 16276 for v in used.values()), used
    assert sum(outcomes) == len([p for p in api.list_pods() if p["spec"].get("nodeName")])
    for n in nodes:
        name = n["metadata"]["name"]
        assert [16276 - used.get((name, i), 0) for i in range(2)] == free_mib(cache, name)


@pytest.mark.parametrize("bad", [
    pytest.param("{", id="not-json"),
    pytest.param(json.dumps({"v": 1}), id="missing-fields"),
])
def test_a_broken_assignment_is_reported_and_not_booked(bad: str) -> None:
    cache = ClusterCache()
    cache.replace_nodes([node("n1", [16276])])
    cache.replace_pods([pod("p", container(mib=1), node_name="n1", annotations={ASSIGNMENT: bad})])
    assert free_mib(cache, "n1") == [16276]
    assert "assignment-v1" in (cache.pods["default/p"].problem or "")


def test_a_patch_without_answer_keeps_the_cards_booked() -> None:
    """The write may have been applied: freeing its cards before the watch says would let the next
    bind give them away a second time."""

    api, cache, binder = world([node("n1", [16276])], one_write=False)
    api.create_pod(pod("p", container(mib=10000)))
    api.create_pod(pod("q", container(mib=10000)))

    def no_answer(namespace: str, name: str, resource_version: str,
                  annotations: dict[str, str | None]) -> dict[str, Any]:
        raise NoAnswerError("PATCH pod default/p: no answer: ReadTimeoutError")

    api.patch_pod_annotations = no_answer  # type: ignore[method-assign]
    result = binder.bind("default", "p", "uid-default-p", "n1")
    assert not result.ok and "stay booked" in result.error
    assert free_mib(cache, "n1") == [6276]
    assert not cache.in_flight()
    assert not binder.bind("default", "q", "uid-default-q", "n1").ok  # the space is not given away twice
