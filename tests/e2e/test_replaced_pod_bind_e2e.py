"""A pod deleted and created again under its name between the bind's decision and its Binding,
against the real, current apiserver.

The current apiserver makes the Binding's uid a precondition of its write
(``BindingREST.setPodNodeAndMetadata``, ``pkg/registry/core/pod/storage/storage.go``): the Binding
decided for the predecessor is refused, the extender's bind reports the replacement, and the
replacement is neither bound nor given the predecessor's cards. (v1.20-v1.22 bound by name alone;
the assignment's ``podUID``, checked by the extender's cache and the node agent's Allocate, still
guards against such an apiserver and is unit-tested in tests/nodeagent and tests/extender.)
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.names import ResourceNames
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.kube.podapi import KubePodApi
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


def test_a_pod_replaced_before_the_binding_is_neither_bound_nor_given_its_predecessors_cards(
        core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode) -> None:
    name = make_node(name=f"gpu-{uuid.uuid4().hex[:6]}")
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node_json(name, [CARD_MIB])])
    old = core_v1.create_namespaced_pod(namespace, pod_manifest(
        "p", limits={GPU_MEM: "16"}, scheduler_name=NO_SCHEDULER))
    cache.replace_pods(json.loads(core_v1.list_namespaced_pod(namespace, _preload_content=False).data)["items"])
    api = ReplaceBeforeBinding(core_v1, pod_manifest("p", limits={GPU_MEM: "48"}, scheduler_name=NO_SCHEDULER))

    result = Binder(cache, api).bind(namespace, "p", old.metadata.uid, name)

    # The apiserver refused the Binding (its uid names the predecessor): the bind says so.
    assert not result.ok
    assert result.error is not None and "was replaced" in result.error
    assert api.replacement_uid in result.error and old.metadata.uid in result.error
    stored = json.loads(core_v1.read_namespaced_pod("p", namespace, _preload_content=False).data)
    assert stored["metadata"]["uid"] == api.replacement_uid != old.metadata.uid
    assert not stored["spec"].get("nodeName")
    assert NAMES.assignment not in (stored["metadata"].get("annotations") or {})

    # The extender, rebuilding from the API: the node's card is free, nothing unreadable.
    rebuilt = ClusterCache(policy="binpack")
    rebuilt.replace_nodes([node_json(name, [CARD_MIB])])
    rebuilt.replace_pods(json.loads(core_v1.list_namespaced_pod(namespace, _preload_content=False).data)["items"])
    assert [u.memory_free for u in rebuilt.state.card_usage(name)] == [CARD_MIB]
    assert not rebuilt.unreadable_on(name)
