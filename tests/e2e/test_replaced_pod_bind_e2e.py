"""A pod deleted and created again under its name between the bind's decision and its Binding,
against the real v1.20.2 apiserver.

v1.20.2 binds by name alone: ``BindingREST.Create`` hands the name to ``assignPod``, whose
``setPodHostAndAnnotations`` runs ``GuaranteedUpdate`` with no preconditions (the Binding's uid and
resourceVersion are never looked at), so the Binding lands on the replacement and merges the
assignment decided for its predecessor. What keeps the cards from the replacement is the
assignment's ``podUID``: asserted here on the pod the apiserver really stored, read back by the
extender's cache and by the node agent's Allocate check.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.annotations import decode_assignment
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard, Topology
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.kube.podapi import KubePodApi
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.pod_view import pod_view_from_json
from gpupool.nodeagent.schedule_check import AssignmentRefused, check_assignment
from tests.e2e.e2e_support import NO_SCHEDULER, MakeNode, pod_manifest
from tests.kube.builders import node as node_json

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
GPU_MEM = "gpupool.io/gpu-mem"
CARD_MIB = 16276


class ReplaceBeforeBinding(KubePodApi):
    """The real API, except that the first Binding is preceded by deleting the pod and creating it
    again under its name (asking for more): the window between the bind's read and its write."""

    def __init__(self, core_v1: client.CoreV1Api, replacement: dict[str, Any]) -> None:
        super().__init__(core_v1)
        self.core_v1 = core_v1
        self.replacement: dict[str, Any] | None = replacement
        self.replacement_uid = ""

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, *,
                 annotations: Mapping[str, str] | None = None, resource_version: str = "") -> None:
        if self.replacement is not None:
            self.core_v1.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            created = self.core_v1.create_namespaced_pod(namespace, self.replacement)
            self.replacement_uid, self.replacement = created.metadata.uid, None
        super().bind_pod(namespace, name, uid, node, annotations=annotations, resource_version=resource_version)


def test_a_pod_replaced_before_the_binding_is_bound_but_never_gets_its_predecessors_cards(
        core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode) -> None:
    name = make_node(name=f"gpu-{uuid.uuid4().hex[:6]}")
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node_json(name, [CARD_MIB])])
    old = core_v1.create_namespaced_pod(namespace, pod_manifest(
        "p", limits={GPU_MEM: "16"}, scheduler_name=NO_SCHEDULER))
    cache.replace_pods(json.loads(core_v1.list_namespaced_pod(namespace, _preload_content=False).data)["items"])
    api = ReplaceBeforeBinding(core_v1, pod_manifest("p", limits={GPU_MEM: "48"}, scheduler_name=NO_SCHEDULER))

    result = Binder(cache, api).bind(namespace, "p", old.metadata.uid, name)

    # The apiserver took the Binding (uid and resourceVersion ignored): the bind cannot tell.
    assert result.ok, result.error
    stored = json.loads(core_v1.read_namespaced_pod("p", namespace, _preload_content=False).data)
    assert stored["metadata"]["uid"] == api.replacement_uid != old.metadata.uid
    assert stored["spec"]["nodeName"] == name
    assignment = decode_assignment(stored["metadata"]["annotations"][NAMES.assignment])
    assert assignment.pod_uid == old.metadata.uid  # decided for the predecessor, and saying so
    foreign = f"decided for pod uid {old.metadata.uid}, not this pod (uid {api.replacement_uid})"

    # The extender, rebuilding from the API: none of the cards booked, GPU pods kept off the node.
    rebuilt = ClusterCache(policy="binpack")
    rebuilt.replace_nodes([node_json(name, [CARD_MIB])])
    rebuilt.replace_pods(json.loads(core_v1.list_namespaced_pod(namespace, _preload_content=False).data)["items"])
    assert [u.memory_free for u in rebuilt.state.card_usage(name)] == [CARD_MIB]
    assert rebuilt.unreadable_on(name) == {f"{namespace}/p"}
    assert foreign in rebuilt.claim_problems[name]

    # The node agent, at the replacement's Allocate: refused, naming both uids.
    view = pod_view_from_json(stored, NAMES)
    assert view.assignment is not None
    container = view.assignment.container("main")
    assert container is not None
    inventory = GpuInventory((GpuCard(0, f"GPU-{name}-0", "Tesla-V100", CARD_MIB),), Topology.flat(1),
                             ("/dev/nvidia0",))
    with pytest.raises(AssignmentRefused, match=re.escape(foreign)):
        check_assignment(name, inventory, view, container, [])
