"""A bind's total time is bounded, and a Binding without an answer keeps its cards booked.

The deadline runs across the bind's attempts: wherever it passes, the bind answers an error that
says so, gives its reservation back exactly once and leaves no assignment behind, except when the
Binding has already been posted (the pod is bound: that is a success).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.kube.podapi import NoAnswerError
from gpupool.testing.fake_api import FakePodApi
from tests.extender.bind_fakes import LaggingWatch
from tests.extender.binder_world import ASSIGNMENT, WRITES, free_mib, world
from tests.kube.builders import container, node, pod

DEADLINE_S = 8.0
SLOW_S = DEADLINE_S + 1
"""What one slow call costs on the fake clock: more than the whole deadline."""


class ClockedApi:
    """The fake API on a fake clock: each call of a verb in ``slow`` moves the clock on by ``SLOW_S``
    once it has been applied (the answer arrives that late)."""

    def __init__(self, api: FakePodApi, slow: str) -> None:
        self.api = api
        self.slow = slow
        self.now = 0.0
        self.read_timeouts: list[float | None] = []

    def _took(self, verb: str) -> None:
        if verb == self.slow:
            self.now += SLOW_S

    def get_pod(self, namespace: str, name: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        self.read_timeouts.append(timeout_s)
        pod_json = self.api.get_pod(namespace, name)
        self._took("get")
        return pod_json

    def patch_pod_annotations(self, namespace: str, name: str, resource_version: str,
                              annotations: dict[str, str | None]) -> dict[str, Any]:
        try:
            return self.api.patch_pod_annotations(namespace, name, resource_version, annotations)
        finally:
            self._took("patch")

    def bind_pod(self, namespace: str, name: str, uid: str, node_name: str, **binding: Any) -> None:
        try:
            self.api.bind_pod(namespace, name, uid, node_name, **binding)
        finally:
            self._took("bind")


@dataclass(frozen=True)
class Expected:
    error: str
    rollbacks: int
    bindings: int
    annotated: bool


@pytest.mark.parametrize(
    ("one_write", "slow", "conflicts", "expected"),
    [
        pytest.param(False, "patch", 0, Expected("deadline while its assignment was written", 1, 0, False),
                     id="assignment-answered-late"),
        pytest.param(False, "patch", 1, Expected("deadline before attempt 2", 1, 0, False),
                     id="conflict-answered-late"),
        pytest.param(False, "get", 1, Expected("deadline while the pod was read", 1, 0, False),
                     id="read-after-a-conflict-late"),
        pytest.param(False, "bind", 0, Expected("", 0, 1, True), id="binding-answered-late-is-bound"),
        # The Binding carries the assignment; ``bindings`` counts the Bindings sent, refused or not.
        pytest.param(True, "bind", 0, Expected("", 0, 1, True), id="one-write-answered-late-is-bound"),
        pytest.param(True, "bind", 1, Expected("deadline before attempt 2", 1, 1, False),
                     id="one-write-conflict-answered-late"),
        pytest.param(True, "get", 1, Expected("deadline while the pod was read", 1, 1, False),
                     id="one-write-read-after-a-conflict-late"),
    ],
)
def test_a_bind_past_its_deadline_says_so_and_rolls_back_once(one_write: bool, slow: str, conflicts: int,
                                                              expected: Expected) -> None:
    api, cache, _ = world([node("n1", [16276])])
    api.create_pod(pod("p", container(mib=10000)))
    api.conflicts_to_inject = conflicts
    api.before_conflict = lambda namespace, name: api.touch_pod(namespace, name)
    clocked = ClockedApi(api, slow)
    binder = Binder(cache, clocked, deadline_s=DEADLINE_S, timer=lambda: clocked.now, annotate_in_binding=one_write)
    rollbacks: list[str] = []
    rollback = cache.rollback

    def counted(key: str) -> None:
        rollbacks.append(key)
        rollback(key)

    cache.rollback = counted  # type: ignore[method-assign]
    result = binder.bind("default", "p", "uid-default-p", "n1")
    assert expected.error in result.error if expected.error else result.ok, result
    assert len(rollbacks) == expected.rollbacks
    assert sum(1 for call in api.calls if call.startswith("bind ")) == expected.bindings
    assert (ASSIGNMENT in api.get_pod("default", "p")["metadata"]["annotations"]) == expected.annotated
    assert bool(api.get_pod("default", "p")["spec"].get("nodeName")) == expected.annotated
    assert cache.in_flight() == 0
    assert free_mib(cache, "n1") == [16276 - 10000 if expected.annotated else 16276]


@pytest.mark.parametrize("one_write", WRITES)
def test_a_pod_read_is_given_only_what_is_left_of_the_deadline(one_write: bool) -> None:
    """A pod missing from the watch's cache is read from the API; an apiserver that stalls that read
    for the client's whole request timeout (10 s) made a bind answer after 10.0 s, past its 8 s
    deadline and kube-scheduler's own timeout."""
    api, cache, _ = world([node("n1", [16276])])
    api.create_pod(pod("p", container(mib=10000)))
    api.conflicts_to_inject = 1
    api.before_conflict = lambda namespace, name: api.touch_pod(namespace, name)
    clocked = ClockedApi(api, "")
    binder = Binder(cache, clocked, deadline_s=DEADLINE_S, timer=lambda: clocked.now, annotate_in_binding=one_write)
    binder.bind("default", "p", "uid-default-p", "n1")
    assert clocked.read_timeouts, "the second attempt reads the pod from the API"
    assert all(t is not None and 0 < t <= DEADLINE_S for t in clocked.read_timeouts), clocked.read_timeouts


@pytest.mark.parametrize("one_write", WRITES)
def test_a_binding_without_answer_keeps_the_cards_booked(one_write: bool) -> None:
    """The Binding reached the apiserver but its answer did not come back: until the watch shows the
    pod bound, freeing its cards would let the next bind give them away a second time."""
    api = FakePodApi()
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("n1", [16276])])
    cache.replace_pods([])
    watch = LaggingWatch(api, cache, lag_s=60.0)
    try:
        api.create_pod(pod("p", container(mib=10000)))
        api.create_pod(pod("q", container(mib=10000)))
        watch.flush()
        post_binding = api.bind_pod

        def applied_without_answer(namespace: str, name: str, uid: str, node_name: str, **binding: Any) -> None:
            post_binding(namespace, name, uid, node_name, **binding)
            raise NoAnswerError(f"POST binding {namespace}/{name}: no answer: ReadTimeoutError")

        api.bind_pod = applied_without_answer  # type: ignore[method-assign]
        binder = Binder(cache, api, annotate_in_binding=one_write)
        result = binder.bind("default", "p", "uid-default-p", "n1")
        assert "stay booked" in result.error
        assert cache.in_flight() == 0
        assert free_mib(cache, "n1") == [6276]
        assert "does not fit" in binder.bind("default", "q", "uid-default-q", "n1").error
        api.bind_pod = post_binding  # type: ignore[method-assign]
        assert binder.bind("default", "p", "uid-default-p", "n1").ok  # kube-scheduler's retry
        watch.flush()
        assert free_mib(cache, "n1") == [6276]
        assert api.get_pod("default", "p")["spec"]["nodeName"] == "n1"
        assert ASSIGNMENT in api.get_pod("default", "p")["metadata"]["annotations"]
    finally:
        watch.close()
