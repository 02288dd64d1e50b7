"""Resource groups, GPU quotas and pools through the real kube-scheduler and kube-apiserver (v1.37.2).

The CRDs of deploy/crds/ are installed in the test control plane, the extender runs as deployed
(``gpupool extender``, watching the custom resources), and two tenants' pods are scheduled by the
real kube-scheduler. Nodes are API objects without a kubelet publishing ``inventory-v1``, so pods
end *bound*, which is all the scheduling side decides; the cards each got are read from their
``assignment-v1`` annotation.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils
from kubernetes.client.rest import ApiException

from gpupool.api.annotations import Inventory, decode_assignment, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard
from tests.e2e.conftest import delete_namespace
from tests.e2e.e2e_support import ExtenderProcess, MakeNode, wait_crds_gone, wait_for

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"
GROUP, VERSION = "gpupool.io", "v1alpha1"
CARD_MIB = 16_384


@pytest.fixture(scope="module")
def crds(kube_api_client: client.ApiClient) -> Iterator[None]:
    """deploy/crds/ installed (and Established) for this module; removed after it."""
    extensions = client.ApiextensionsV1Api(kube_api_client)
    docs = [doc for doc in (yaml.safe_load(path.read_text()) for path in sorted(CRDS.glob("*.yaml")))
            if doc.get("kind") == "CustomResourceDefinition"]  # not the directory's kustomization.yaml
    names = [doc["metadata"]["name"] for doc in docs]
    # a module before this one (a chart's uninstall) may still be deleting them: 409 "being deleted"
    terminating = {c.metadata.name for c in extensions.list_custom_resource_definition().items
                   if c.metadata.name in names and c.metadata.deletion_timestamp is not None}
    if terminating:
        wait_crds_gone(extensions, terminating)
    for doc in docs:
        utils.create_from_dict(kube_api_client, doc)
    for name in names:
        wait_for(lambda n=name: any(c.type == "Established" and c.status == "True" for c in
                                    extensions.read_custom_resource_definition(n).status.conditions or []),
                 timeout=30, what=f"CRD {name} established")
    yield
    for name in names:
        extensions.delete_custom_resource_definition(name)
    # Deletion ends when the apiserver has removed every instance; the next module installing the
    # same CRDs (the quota webhook's tests reuse this fixture) would otherwise get 409 "being deleted".
    wait_crds_gone(extensions, set(names))


@pytest.fixture
def custom(kube_api_client: client.ApiClient, crds: None) -> Iterator[client.CustomObjectsApi]:
    """The custom objects API; every ResourceGroup a test creates is deleted after it."""
    api = client.CustomObjectsApi(kube_api_client)
    yield api
    for item in api.list_cluster_custom_object(GROUP, VERSION, "resourcegroups")["items"]:
        api.delete_cluster_custom_object(GROUP, VERSION, "resourcegroups", item["metadata"]["name"])


@pytest.fixture
def second_namespace(core_v1: client.CoreV1Api) -> Iterator[str]:
    name = f"e2e-b-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    delete_namespace(core_v1, name)


def gpu_node(make_node: MakeNode, cards: int, labels: dict[str, str] | None = None) -> str:
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    inventory = Inventory(tuple(GpuCard(i, f"GPU-{name}-{i}", "Tesla-T4", CARD_MIB) for i in range(cards)))
    return make_node(name, {"cpu": "64", "memory": "256Gi", "pods": "250"}, labels=labels,
                     annotations={NAMES.inventory: encode_inventory(inventory)})


def resource_group(api: client.CustomObjectsApi, name: str, nodes: dict[str, list[str] | None], *,
                   shared: bool = False, namespaces: tuple[str, ...] = ()) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceGroup", "metadata": {"name": name},
            "spec": {"shared": shared,
                     "nodes": [{"name": n} if g is None else {"name": n, "gpus": g} for n, g in nodes.items()],
                     "subjects": [{"kind": "Namespace", "name": ns} for ns in namespaces]}}
    api.create_cluster_custom_object(GROUP, VERSION, "resourcegroups", body)


def extender_sees_groups(extender: ExtenderProcess, node: str, namespace: str, *groups: str) -> None:
    """Until the extender's watch has the groups: kube-scheduler retries a pod refused for an unknown
    group only on its own timers or the extender's wake-up (kube-scheduler does not watch these CRs),
    so pods are created after."""
    def known(group: str) -> bool:
        probe = pod("probe", core=10, group=group)
        probe["metadata"]["namespace"] = namespace
        body = json.dumps({"Pod": probe, "NodeNames": [node]}).encode()
        request = urllib.request.Request(f"{extender.url}/filter", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as resp:
            answer = json.loads(resp.read())
        return "does not exist" not in json.dumps(answer.get("FailedNodes") or {})
    for group in groups:
        wait_for(lambda g=group: known(g) or None, timeout=30, what=f"the extender knowing resource group {group}")


def gpu_quota(api: client.CustomObjectsApi, namespace: str, spec: dict[str, Any]) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuQuota", "metadata": {"name": "gpus"}, "spec": spec}
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpuquotas", body)


def pod(name: str, *, core: int = 0, whole: int = 0, group: str | None = None) -> dict[str, Any]:
    limits = {NAMES.gpu: str(whole)} if whole else {NAMES.gpu_core: str(core)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"gpupool.io/group": group} if group else {}},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": limits, "requests": {"cpu": "10m"}}}]}}


def cards_of(core_v1: client.CoreV1Api, namespace: str, name: str, timeout: float = 60) -> set[str]:
    """The GPU UUIDs the pod was bound with (waits for the bind)."""
    def bound() -> set[str] | None:
        found = core_v1.read_namespaced_pod(name, namespace)
        text = (found.metadata.annotations or {}).get(NAMES.assignment)
        if not found.spec.node_name or not text:
            return None
        return {ref.uuid for c in decode_assignment(text).containers for ref in c.cards}
    return wait_for(bound, timeout=timeout, what=f"pod {namespace}/{name} bound")


def refused_with(core_v1: client.CoreV1Api, namespace: str, name: str, text: str, timeout: float = 60) -> str:
    """The FailedScheduling event of the pod whose message holds ``text`` (waits for it)."""
    def event() -> str | None:
        for e in core_v1.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items:
            if e.reason == "FailedScheduling" and text in (e.message or ""):
                return str(e.message)
        return None
    return wait_for(event, timeout=timeout, what=f"FailedScheduling of {name} saying {text!r}")


def still_pending(core_v1: client.CoreV1Api, namespace: str, name: str) -> bool:
    return not core_v1.read_namespaced_pod(name, namespace).spec.node_name


def nudge_scheduler(core_v1: client.CoreV1Api, node: str) -> None:
    """A node label change: kube-scheduler does not watch gpupool's objects, and retries pods it
    found unschedulable on cluster events (or after 60 s); this is such an event."""
    core_v1.patch_node(node, {"metadata": {"labels": {"e2e-nudge": str(time.monotonic_ns())}}})


def test_two_tenants_groups_over_shared_and_unshared_gpus(
    core_v1: client.CoreV1Api, namespace: str, second_namespace: str, make_node: MakeNode,
    custom: client.CustomObjectsApi, gpupool_extender: ExtenderProcess,
) -> None:
    a_only, both, b_only = gpu_node(make_node, 2), gpu_node(make_node, 2), gpu_node(make_node, 2)
    resource_group(custom, "team-a", {a_only: None, both: [f"GPU-{both}-0"]}, namespaces=(namespace,))
    resource_group(custom, "team-b", {both: [f"GPU-{both}-1"], b_only: None}, shared=True,
                   namespaces=(second_namespace,))
    extender_sees_groups(gpupool_extender, both, namespace, "team-a", "team-b")
    a_cards = {f"GPU-{a_only}-0", f"GPU-{a_only}-1", f"GPU-{both}-0"}
    b_cards = {f"GPU-{both}-1", f"GPU-{b_only}-0", f"GPU-{b_only}-1"}
    for i in range(3):
        core_v1.create_namespaced_pod(namespace, pod(f"a{i}", whole=1, group="team-a"))
        core_v1.create_namespaced_pod(second_namespace, pod(f"b{i}", whole=1, group="team-b"))
    held_a = set().union(*(cards_of(core_v1, namespace, f"a{i}") for i in range(3)))
    held_b = set().union(*(cards_of(core_v1, second_namespace, f"b{i}") for i in range(3)))
    assert held_a == a_cards and held_b == b_cards  # each tenant filled exactly its group's GPUs
    core_v1.create_namespaced_pod(second_namespace, pod("intruder", core=10, group="team-a"))
    refused_with(core_v1, second_namespace, "intruder", f"does not admit namespace {second_namespace}")
    core_v1.create_namespaced_pod(namespace, pod("a-more", core=10, group="team-a"))
    message = refused_with(core_v1, namespace, "a-more", "0/")  # the group is full
    assert "not in resource group team-a" in message and still_pending(core_v1, namespace, "a-more"), message


def test_a_pod_without_a_group_stays_off_reserved_gpus_but_may_use_shared_ones(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, custom: client.CustomObjectsApi,
    gpupool_extender: ExtenderProcess,
) -> None:
    reserved, shared = gpu_node(make_node, 1), gpu_node(make_node, 1)
    resource_group(custom, "reserved", {reserved: None})
    resource_group(custom, "open", {shared: None}, shared=True)
    core_v1.create_namespaced_pod(namespace, pod("free", whole=1))
    assert cards_of(core_v1, namespace, "free") == {f"GPU-{shared}-0"}
    core_v1.create_namespaced_pod(namespace, pod("more", whole=1))
    refused_with(core_v1, namespace, "more", "reserved by a resource group")


@pytest.mark.compat
def test_a_quota_reached_refuses_with_limit_used_and_asked_until_gpus_are_freed(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, custom: client.CustomObjectsApi,
    gpupool_extender: ExtenderProcess,
) -> None:
    node = gpu_node(make_node, 4)
    gpu_quota(custom, namespace, {"hard": {"wholeGpus": 1, "computePercent": 250}})
    time.sleep(1)  # the extender's watch delivers the quota
    core_v1.create_namespaced_pod(namespace, pod("first", whole=1))
    cards_of(core_v1, namespace, "first")
    core_v1.create_namespaced_pod(namespace, pod("second", whole=1))
    message = refused_with(core_v1, namespace, "second", f"GpuQuota {namespace}/gpus")
    assert f"GpuQuota {namespace}/gpus: whole GPUs limit 1, used 1, asked 1" in message
    core_v1.create_namespaced_pod(namespace, pod("slice", core=40))
    cards_of(core_v1, namespace, "slice")  # 100 + 40 of the 250 percent compute: room left
    core_v1.delete_namespaced_pod("first", namespace, grace_period_seconds=0)
    assert cards_of(core_v1, namespace, "second", timeout=90) <= {f"GPU-{node}-{i}" for i in range(4)}


def test_a_pool_keeps_a_namespace_on_its_nodes(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, custom: client.CustomObjectsApi,
    gpupool_extender: ExtenderProcess,
) -> None:
    public = gpu_node(make_node, 1, labels={"gpupool.io/pool": "public"})
    gpu_node(make_node, 4, labels={"gpupool.io/pool": "wx"})
    gpu_quota(custom, namespace, {"pools": ["public"]})
    time.sleep(1)
    for i in range(2):
        core_v1.create_namespaced_pod(namespace, pod(f"p{i}", whole=1))
    bound = wait_for(lambda: [n for n in ("p0", "p1") if not still_pending(core_v1, namespace, n)] or None,
                     timeout=60, what="one pod bound")
    assert len(bound) == 1
    assert cards_of(core_v1, namespace, bound[0]) == {f"GPU-{public}-0"}
    waiting = ({"p0", "p1"} - set(bound)).pop()
    refused_with(core_v1, namespace, waiting, "not in a pool GpuQuota")


def test_a_group_changed_while_a_pod_is_pending(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, custom: client.CustomObjectsApi,
    gpupool_extender: ExtenderProcess,
) -> None:
    first, second = gpu_node(make_node, 1), gpu_node(make_node, 1)
    resource_group(custom, "grow", {first: None})
    core_v1.create_namespaced_pod(namespace, pod("holder", whole=1, group="grow"))
    assert cards_of(core_v1, namespace, "holder") == {f"GPU-{first}-0"}
    core_v1.create_namespaced_pod(namespace, pod("waiter", whole=1, group="grow"))
    refused_with(core_v1, namespace, "waiter", "not in resource group grow")
    patch = {"spec": {"nodes": [{"name": first}, {"name": second}]}}
    custom.patch_cluster_custom_object(GROUP, VERSION, "resourcegroups", "grow", patch)
    time.sleep(1)  # the extender's watch delivers the change
    nudge_scheduler(core_v1, second)
    assert cards_of(core_v1, namespace, "waiter", timeout=90) == {f"GPU-{second}-0"}


def test_broken_objects_are_refused_by_the_apiserver_schema(custom: client.CustomObjectsApi, namespace: str) -> None:
    with pytest.raises(ApiException) as caught:
        gpu_quota(custom, namespace, {"hard": {"wholeGpus": -1}})
    assert caught.value.status == 422
