"""The Kubernetes API behaviour gpupool relies on, checked against a real apiserver (v1.37.2).

The extender binds pods and writes assignment annotations with optimistic concurrency, and the
node agent rebuilds its view from list + watch. Each test pins down one contract those designs
assume, so a surprise shows up here rather than as a double-booked card.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import NO_SCHEDULER, MakeNode, condition, pod_manifest, wait_for

pytestmark = pytest.mark.e2e

GPU_MEM = "gpupool.io/gpu-mem"


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_pod_with_extended_resource_is_scheduled_onto_the_node_that_has_it(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode
) -> None:
    make_node(allocatable={"cpu": "8"})  # a node without the resource must not be chosen
    gpu_node = make_node(allocatable={GPU_MEM: "16"})
    core_v1.create_namespaced_pod(namespace, pod_manifest("gpu", limits={GPU_MEM: "4"}))

    pod = wait_for(lambda: _scheduled(core_v1, namespace, "gpu"), timeout=30, what="pod scheduled")

    assert pod.spec.node_name == gpu_node
    assert pod.spec.containers[0].resources.requests == {GPU_MEM: "4"}  # defaulted from limits
    assert condition(pod, "PodScheduled").status == "True"
    assert pod.status.phase == "Pending"  # no kubelet behind a bare Node object


def test_pod_requesting_more_than_any_node_has_stays_pending_as_unschedulable(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode
) -> None:
    make_node(allocatable={GPU_MEM: "16"})
    core_v1.create_namespaced_pod(namespace, pod_manifest("huge", limits={GPU_MEM: "64"}))

    def unschedulable() -> client.V1PodCondition | None:
        pod = core_v1.read_namespaced_pod("huge", namespace)
        cond = condition(pod, "PodScheduled")
        return cond if cond is not None and cond.reason == "Unschedulable" else None

    cond = wait_for(unschedulable, timeout=30, what="PodScheduled=False/Unschedulable")
    assert cond.status == "False"
    assert f"Insufficient {GPU_MEM}" in cond.message
    time.sleep(2)
    pod = core_v1.read_namespaced_pod("huge", namespace)
    assert pod.spec.node_name is None
    assert pod.status.phase == "Pending"


def test_pod_for_an_unserved_scheduler_stays_pending_untouched(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode
) -> None:
    make_node(allocatable={GPU_MEM: "16"})
    core_v1.create_namespaced_pod(namespace, pod_manifest("orphan", limits={GPU_MEM: "1"},
                                                          scheduler_name=NO_SCHEDULER))
    time.sleep(3)
    pod = core_v1.read_namespaced_pod("orphan", namespace)
    assert pod.spec.node_name is None
    assert pod.status.phase == "Pending"
    assert condition(pod, "PodScheduled") is None  # the default scheduler never looked at it


def test_binding_post_binds_the_pod_and_a_second_binding_conflicts(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode
) -> None:
    node_a = make_node()
    node_b = make_node()
    core_v1.create_namespaced_pod(namespace, pod_manifest("bindme", scheduler_name=NO_SCHEDULER))

    _post_binding(core_v1, namespace, "bindme", node_a)

    pod = core_v1.read_namespaced_pod("bindme", namespace)
    assert pod.spec.node_name == node_a
    assert condition(pod, "PodScheduled").status == "True"
    with pytest.raises(ApiException) as excinfo:
        _post_binding(core_v1, namespace, "bindme", node_b)
    assert excinfo.value.status == 409
    assert core_v1.read_namespaced_pod("bindme", namespace).spec.node_name == node_a


def test_binding_a_missing_pod_is_404(core_v1: client.CoreV1Api, namespace: str) -> None:
    with pytest.raises(ApiException) as excinfo:
        _post_binding(core_v1, namespace, "no-such-pod", "any-node")
    assert excinfo.value.status == 404


def test_annotation_update_with_a_stale_resource_version_is_a_409_conflict(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    core_v1.create_namespaced_pod(namespace, pod_manifest("annotated", scheduler_name=NO_SCHEDULER))
    stale = core_v1.read_namespaced_pod("annotated", namespace)
    stale_rv = stale.metadata.resource_version

    # Writer 1 wins: a merge patch carrying the resourceVersion it read.
    core_v1.patch_namespaced_pod("annotated", namespace, {"metadata": {
        "resourceVersion": stale_rv, "annotations": {"gpupool.io/assignment-v1": "writer-1"}}})

    # Writer 2 read the same version: both a PUT and a patch with that version now conflict.
    stale.metadata.annotations = {"gpupool.io/assignment-v1": "writer-2"}
    with pytest.raises(ApiException) as put_conflict:
        core_v1.replace_namespaced_pod("annotated", namespace, stale)
    assert put_conflict.value.status == 409
    assert json.loads(put_conflict.value.body)["reason"] == "Conflict"
    with pytest.raises(ApiException) as patch_conflict:
        core_v1.patch_namespaced_pod("annotated", namespace, {"metadata": {
            "resourceVersion": stale_rv, "annotations": {"gpupool.io/assignment-v1": "writer-2"}}})
    assert patch_conflict.value.status == 409

    fresh = core_v1.read_namespaced_pod("annotated", namespace)
    assert fresh.metadata.annotations["gpupool.io/assignment-v1"] == "writer-1"
    assert fresh.metadata.resource_version != stale_rv
    # Re-reading and retrying with the fresh version succeeds.
    fresh.metadata.annotations["gpupool.io/assignment-v1"] = "writer-2"
    core_v1.replace_namespaced_pod("annotated", namespace, fresh)
    final = core_v1.read_namespaced_pod("annotated", namespace).metadata.annotations
    assert final["gpupool.io/assignment-v1"] == "writer-2"


def test_label_and_field_selectors_filter_lists(core_v1: client.CoreV1Api, namespace: str) -> None:
    node = _unique("sel-node")
    tag = _unique("t")
    for name, app, node_name in (("a1", "a", node), ("a2", "a", None), ("b1", "b", node)):
        core_v1.create_namespaced_pod(namespace, pod_manifest(
            name, labels={"app": app, "tag": tag}, node_name=node_name, scheduler_name=NO_SCHEDULER))

    def names(**selectors: str) -> set[str]:
        return {p.metadata.name for p in core_v1.list_namespaced_pod(namespace, **selectors).items}

    assert names(label_selector="app=a") == {"a1", "a2"}
    assert names(label_selector="app in (a,b),app!=b") == {"a1", "a2"}
    assert names(field_selector=f"spec.nodeName={node}") == {"a1", "b1"}
    assert names(field_selector="spec.nodeName=") == {"a2"}  # how a scheduler lists unbound pods
    assert names(label_selector="app=a", field_selector=f"spec.nodeName={node}") == {"a1"}
    assert names(field_selector="metadata.name=b1") == {"b1"}
    everywhere = core_v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}",
                                                     label_selector=f"tag={tag}")
    assert {(p.metadata.namespace, p.metadata.name) for p in everywhere.items} == {
        (namespace, "a1"), (namespace, "b1")}
    assert names(field_selector=f"spec.schedulerName={NO_SCHEDULER},status.phase=Pending") == {
        "a1", "a2", "b1"}
    with pytest.raises(ApiException) as excinfo:
        core_v1.list_namespaced_pod(namespace, field_selector="spec.hostname=x")
    assert excinfo.value.status == 400  # only a few pod fields are selectable


def test_watch_resumed_from_a_resource_version_sees_the_events_after_it(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    tag = _unique("w")
    listed = core_v1.list_namespaced_pod(namespace, label_selector=f"tag={tag}")
    assert listed.items == []
    resume_from = listed.metadata.resource_version

    # All three events happen before the watch starts: a resumed watch must replay them.
    core_v1.create_namespaced_pod(namespace, pod_manifest("watched", labels={"tag": tag},
                                                          scheduler_name=NO_SCHEDULER))
    core_v1.patch_namespaced_pod("watched", namespace, {"metadata": {"annotations": {"step": "2"}}})
    core_v1.delete_namespaced_pod("watched", namespace, grace_period_seconds=0)

    seen: list[tuple[str, str | None, bool]] = []
    stream = watch.Watch().stream(core_v1.list_namespaced_pod, namespace, label_selector=f"tag={tag}",
                                  resource_version=resume_from, timeout_seconds=10)
    for event in stream:
        obj = event["object"]
        step = (obj.metadata.annotations or {}).get("step")
        seen.append((event["type"], step, obj.metadata.deletion_timestamp is not None))
        if event["type"] == "DELETED":
            break
    # Even a grace-period-0 delete is two events: MODIFIED with deletionTimestamp, then DELETED.
    assert seen == [("ADDED", None, False), ("MODIFIED", "2", False), ("MODIFIED", "2", True),
                    ("DELETED", "2", True)]


def test_watch_from_a_version_older_than_the_apiservers_watch_cache_gets_410_gone(
    core_v1: client.CoreV1Api, namespace: str, control_plane: ControlPlane
) -> None:
    tag = _unique("gone")
    listed = core_v1.list_namespaced_pod(namespace, label_selector=f"tag={tag}")
    old_version = listed.metadata.resource_version
    core_v1.create_namespaced_pod(namespace, pod_manifest("after", labels={"tag": tag},
                                                          scheduler_name=NO_SCHEDULER))
    # A restarted apiserver fills its watch cache from a fresh list; older versions are gone, the
    # same "too old resource version" answer as after etcd compaction.
    control_plane.restart_apiserver()

    status = _first_watch_status(core_v1, namespace, old_version)
    assert status["kind"] == "Status"
    assert status["code"] == 410
    assert status["reason"] in ("Expired", "Gone")
    assert "too old resource version" in status["message"]

    # The recovery every watcher needs: relist, then watch from the new list's version.
    relisted = core_v1.list_namespaced_pod(namespace, label_selector=f"tag={tag}")
    assert [p.metadata.name for p in relisted.items] == ["after"]
    core_v1.patch_namespaced_pod("after", namespace, {"metadata": {"annotations": {"step": "3"}}})
    stream = watch.Watch().stream(core_v1.list_namespaced_pod, namespace, label_selector=f"tag={tag}",
                                  resource_version=relisted.metadata.resource_version, timeout_seconds=10)
    event = next(iter(stream))
    assert event["type"] == "MODIFIED"
    assert event["object"].metadata.annotations["step"] == "3"


def _first_watch_status(core_v1: client.CoreV1Api, namespace: str, version: str) -> dict[str, Any]:
    """The Status a watch from ``version`` fails with: an ERROR event (or, rarely, an HTTP 410)."""
    response = core_v1.list_namespaced_pod(namespace, watch=True, resource_version=version,
                                           timeout_seconds=5, _preload_content=False)
    try:
        if response.status == 410:
            status: dict[str, Any] = json.loads(response.data)
            return status
        assert response.status == 200
        first_line = response.readline()
        event = json.loads(first_line)
        assert event["type"] == "ERROR", event
        status = event["object"]
        return status
    finally:
        response.release_conn()


def _scheduled(core_v1: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    pod = core_v1.read_namespaced_pod(name, namespace)
    return pod if pod.spec.node_name else None


def _post_binding(core_v1: client.CoreV1Api, namespace: str, pod: str, node: str) -> None:
    """POST a Binding; the response is a Status, which the generated client cannot deserialise."""
    body = client.V1Binding(metadata=client.V1ObjectMeta(name=pod),
                            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node))
    core_v1.create_namespaced_binding(namespace, body, _preload_content=False)
