"""The one-write bind against a real apiserver (v1.37.2): what a Binding does to the pod it binds.

The extender's bind posts one Binding that carries the assignment annotation. It relies on the
apiserver merging the Binding's annotations into the pod in the same write that sets its node,
and on a second Binding of a bound pod being refused (409) without touching the pod, and (since
v1.23) on the Binding's uid and resourceVersion being preconditions: a Binding decided for a pod
replaced under its name is refused (docs/extender.md, "Bind"); that case is in the compatibility
set, so it also runs on the oldest pinned release.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.api.annotations import decode_assignment
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.kube.client_config import api_configuration
from gpupool.kube.podapi import KubePodApi
from gpupool.testenv.audit import read_audit_log
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import NO_SCHEDULER, MakeNode, pod_manifest
from tests.kube.builders import node as node_json

pytestmark = pytest.mark.e2e

ASSIGNMENT = "gpupool.io/assignment-v1"
GPU_MEM = "gpupool.io/gpu-mem"
AUDIT_SETTLE_S = 1.0
"""How long the audit log may take to show a request after its answer."""


def _binding(core_v1: client.CoreV1Api, namespace: str, pod: str, node: str, *, uid: str = "",
             resource_version: str = "", annotations: dict[str, str] | None = None) -> None:
    meta: dict[str, Any] = {"name": pod, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if resource_version:
        meta["resourceVersion"] = resource_version
    if annotations:
        meta["annotations"] = annotations
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    core_v1.create_namespaced_pod_binding(pod, namespace, body, _preload_content=False)


def test_a_binding_leaves_its_annotations_on_the_pod_and_a_second_binding_is_refused(
        core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode) -> None:
    node_a, node_b = make_node(), make_node()
    created = core_v1.create_namespaced_pod(
        namespace, pod_manifest("p", scheduler_name=NO_SCHEDULER) | {"metadata": {
            "name": "p", "annotations": {"other": "kept"}}})
    _binding(core_v1, namespace, "p", node_a, uid=created.metadata.uid,
             annotations={ASSIGNMENT: "first"})

    bound = core_v1.read_namespaced_pod("p", namespace)
    assert bound.spec.node_name == node_a
    assert bound.metadata.annotations == {"other": "kept", ASSIGNMENT: "first"}  # merged, not replaced
    with pytest.raises(ApiException) as refused:
        _binding(core_v1, namespace, "p", node_b, uid=created.metadata.uid, annotations={ASSIGNMENT: "second"})
    assert refused.value.status == 409
    assert "already assigned" in json.loads(refused.value.body)["message"]
    after = core_v1.read_namespaced_pod("p", namespace)
    assert after.spec.node_name == node_a
    assert after.metadata.annotations[ASSIGNMENT] == "first"
    assert after.metadata.resource_version == bound.metadata.resource_version  # nothing written


@pytest.mark.compat
@pytest.mark.parametrize("stale", [pytest.param("uid", id="old-uid"), pytest.param("version", id="old-version")])
def test_a_binding_for_a_pod_replaced_under_its_name_is_refused(
        core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, stale: str) -> None:
    """The Binding's uid and resourceVersion are preconditions of the write
    (``BindingREST.setPodNodeAndMetadata``, ``pkg/registry/core/pod/storage/storage.go``; since
    v1.23, kubernetes#105913): a Binding decided for a pod that was replaced under its name is a 409
    Conflict, and the replacement stays unbound and unannotated."""
    target = make_node()
    old = core_v1.create_namespaced_pod(namespace, pod_manifest("p", scheduler_name=NO_SCHEDULER))
    core_v1.delete_namespaced_pod("p", namespace, grace_period_seconds=0)
    replacement = core_v1.create_namespaced_pod(namespace, pod_manifest("p", scheduler_name=NO_SCHEDULER))
    assert replacement.metadata.uid != old.metadata.uid
    with pytest.raises(ApiException) as refused:
        _binding(core_v1, namespace, "p", target,
                 uid=old.metadata.uid if stale == "uid" else replacement.metadata.uid,
                 resource_version=old.metadata.resource_version, annotations={ASSIGNMENT: "for-the-old-pod"})
    assert refused.value.status == 409
    after = core_v1.read_namespaced_pod("p", namespace)
    assert after.spec.node_name is None and ASSIGNMENT not in (after.metadata.annotations or {})


@pytest.mark.parametrize("one_write", [pytest.param(True, id="assignment-in-binding"),
                                       pytest.param(False, id="patch-then-binding")])
def test_the_binder_writes_once_per_bind_and_the_pod_carries_its_cards(
        control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode,
        one_write: bool) -> None:
    """Counted in the apiserver's audit log: one POST of pods/binding, no PATCH (or one of each
    on the two-write path); the bound pod's assignment names the node and its card."""
    name = make_node(name=f"gpu-{uuid.uuid4().hex[:6]}")
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node_json(name, [16276])])
    pods = [core_v1.create_namespaced_pod(namespace, pod_manifest(
        f"g{i}", limits={GPU_MEM: "16"}, scheduler_name=NO_SCHEDULER)) for i in range(3)]
    listed = json.loads(core_v1.list_namespaced_pod(namespace, _preload_content=False).data)["items"]
    cache.replace_pods(listed)
    audited = client.CoreV1Api(client.ApiClient(api_configuration(str(control_plane.audited_kubeconfig))))
    binder = Binder(cache, KubePodApi(audited), annotate_in_binding=one_write)
    started = time.time()
    for p in pods:
        result = binder.bind(namespace, p.metadata.name, p.metadata.uid, name)
        assert result.ok, result.error
    time.sleep(AUDIT_SETTLE_S)
    writes = Counter(r.what for r in read_audit_log(control_plane.audit_log)
                     if r.namespace == namespace and r.received >= started - 1 and r.complete)
    expected = {"create pods/binding": 3} if one_write else {"create pods/binding": 3, "patch pods": 3}
    assert dict(writes) == expected
    for p in pods:
        stored = core_v1.read_namespaced_pod(p.metadata.name, namespace)
        assignment = decode_assignment(stored.metadata.annotations[ASSIGNMENT])
        assert stored.spec.node_name == assignment.node == name
        assert [ref.index for c in assignment.containers for ref in c.cards] == [0]
