"""The Binding that carries the assignment: one write binds the pod and records its cards.

What the two writes' resourceVersion precondition on the PATCH guarded must still hold: a stale
copy of the pod, or a pod replaced under the same name, never ends bound with an assignment made
from what was read. The fake API checks the Binding's preconditions as apiservers from v1.23 do
(v1.20-v1.22 ignore them: docs/extender.md, "Bind"), and no pod is ever annotated without being bound.
"""

from __future__ import annotations

from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.testing.fake_api import FakePodApi
from tests.extender.bind_fakes import LaggingWatch
from tests.extender.binder_world import ASSIGNMENT, free_mib
from tests.kube.builders import container, node, pod

WATCH_BEHIND_S = 60.0
"""The cache sees a change only when the test flushes the watch."""


def lagging_world() -> tuple[FakePodApi, ClusterCache, LaggingWatch]:
    api = FakePodApi()
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("n1", [16276])])
    cache.replace_pods([])
    return api, cache, LaggingWatch(api, cache, WATCH_BEHIND_S)


def test_a_stale_copy_costs_one_conflict_and_one_read() -> None:
    """The watch's copy is behind the pod: the Binding's resourceVersion precondition refuses it,
    and the second attempt reads the pod and binds it."""
    api, cache, watch = lagging_world()
    try:
        created = api.create_pod(pod("p", container(mib=8000)))
        watch.flush()
        api.touch_pod("default", "p")  # the cache still has the version before this
        api.calls.clear()
        result = Binder(cache, api).bind("default", "p", created["metadata"]["uid"], "n1")
        assert result.ok and result.attempts == 2, result
        assert api.calls == ["bind default/p n1", "get default/p", "bind default/p n1"]
        assert ASSIGNMENT in api.get_pod("default", "p")["metadata"]["annotations"]
        assert free_mib(cache, "n1") == [8276]
    finally:
        watch.close()


def test_a_pod_replaced_under_its_name_is_not_bound_with_its_predecessors_assignment() -> None:
    """The pod kube-scheduler scheduled was deleted and another created under its name, which asks
    for more: the Binding names the old uid and is refused; the bind reads the pod, sees the new uid
    and refuses. Nothing is booked, the new pod is neither bound nor annotated."""
    api, cache, watch = lagging_world()
    try:
        old = api.create_pod(pod("p", container(mib=4000)))
        watch.flush()
        api.delete_pod("default", "p")
        api.create_pod(pod("p", container(mib=16000), uid="uid-of-the-replacement"))
        result = Binder(cache, api).bind("default", "p", old["metadata"]["uid"], "n1")
        assert "was replaced" in result.error, result
        assert free_mib(cache, "n1") == [16276]
        replacement = api.get_pod("default", "p")
        assert not replacement["spec"].get("nodeName")
        assert ASSIGNMENT not in (replacement["metadata"].get("annotations") or {})
    finally:
        watch.close()


def test_a_refused_binding_leaves_no_assignment_behind() -> None:
    """Two writes could leave a pod annotated but unbound (the Binding failed, the clean-up too);
    one write cannot: the pod is bound elsewhere already and keeps no trace of this bind."""
    api, cache, watch = lagging_world()
    try:
        created = api.create_pod(pod("p", container(mib=8000)))
        watch.flush()
        api.bind_pod("default", "p", created["metadata"]["uid"], "n2")  # someone else, no assignment
        api.calls.clear()
        result = Binder(cache, api).bind("default", "p", created["metadata"]["uid"], "n1")
        assert "already bound to node n2" in result.error
        assert not any(call.startswith("patch") for call in api.calls)
        assert ASSIGNMENT not in (api.get_pod("default", "p")["metadata"].get("annotations") or {})
        assert free_mib(cache, "n1") == [16276]
    finally:
        watch.close()


def test_a_pod_deleted_before_its_binding_books_nothing() -> None:
    api, cache, watch = lagging_world()
    try:
        created = api.create_pod(pod("p", container(mib=8000)))
        watch.flush()
        api.delete_pod("default", "p")  # the cache still has the pod
        result = Binder(cache, api).bind("default", "p", created["metadata"]["uid"], "n1")
        assert result.error == "pod default/p no longer exists" and result.attempts == 1
        assert free_mib(cache, "n1") == [16276]
        assert cache.in_flight() == 0
    finally:
        watch.close()
