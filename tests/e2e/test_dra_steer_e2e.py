"""gpupool chooses the node of DRA claim pods (issue 24, docs/dra.md "Choosing between the extender
path and the DRA path"), end to end on the default Kubernetes (v1.37.2).

Two GPU nodes of one 16 GiB card each (Node objects and the ResourceSlices gpupool's agent would
publish for them; no kubelet: the test is about where kube-scheduler puts the pods, and the DRA
allocator allocates at scheduling). Node A holds an 8 GiB claim whose pod asks for 6 CPUs, so
kube-scheduler's default scores (least allocated CPU and memory) prefer node B for anything new.

First, on the plain scheduler (the DRA path as it was), a 4 GiB claim's pod lands on B: the spread.
Then kube-scheduler is configured as gpupool's own (an extender with no ``managedResources``, so it
is asked about every pod; binder), the extender watching claims (``--dra-claims``): the next 4 GiB
claim's pod joins A's partly used card (8 GiB free there, against 12 on B), where gpupool's binpack
packs it, bound by the extender without an assignment. No card is ever allocated beyond its 16 GiB.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.dra import MIB
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard, Topology
from gpupool.kube.quantity import parse_quantity
from gpupool.nodeagent.dra.resource_slice import resource_slice
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.testenv.config import ExtenderConfig
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testing.kube_objects import node as gpu_node
from tests.e2e.dra_support import DRIVER, claim_manifest, dra_installed
from tests.e2e.e2e_support import MakeNode, wait_for
from tests.e2e.trust_support import FlaggedExtender, filter_reason

pytestmark = pytest.mark.e2e

CARD_MIB = 16 * 1024


def inventory(node: str) -> GpuInventory:
    card = GpuCard(index=0, uuid=f"GPU-{node}-0", model="Tesla-T4", memory_mib=CARD_MIB)
    return GpuInventory((card,), Topology.flat(1), ("/dev/nvidia0",))


def claim_pod(name: str, claim: str, nodes: tuple[str, str], cpu: str = "0", pinned: str = "") -> dict[str, Any]:
    """A pod using ``claim``, allowed on the test's two nodes only (or ``pinned`` to one)."""
    allowed = [pinned] if pinned else list(nodes)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 0,
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "kubernetes.io/hostname", "operator": "In", "values": allowed}]}]}}},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"claims": [{"name": "gpu"}], "requests": {"cpu": cpu}}}]}}


@pytest.fixture
def two_gpu_nodes(make_node: MakeNode, kube_api_client: client.ApiClient) -> Iterator[tuple[str, str]]:
    """Nodes A and B with their slices and gpupool's DeviceClass (removed afterwards)."""
    suffix = uuid.uuid4().hex[:6]
    names = (f"steer-a-{suffix}", f"steer-b-{suffix}")
    for name in names:
        make_node(name, allocatable={"cpu": "8", "memory": "32Gi"},
                  annotations=gpu_node(name, [CARD_MIB])["metadata"]["annotations"])
    resource = client.ResourceV1Api(kube_api_client)
    with dra_installed(kube_api_client, names[0]):
        try:
            for name in names:
                resource.create_resource_slice(resource_slice(name, DRIVER, inventory(name), generation=1))
            yield names
        finally:
            for item in resource.list_resource_slice(field_selector=f"spec.nodeName={names[1]}").items:
                resource.delete_resource_slice(item.metadata.name)


def bound_node(core_v1: client.CoreV1Api, namespace: str, pod: str) -> str | None:
    return core_v1.read_namespaced_pod(pod, namespace).spec.node_name or None


def allocated_mib(api: client.ApiClient, namespace: str) -> dict[tuple[str, str], int]:
    """MiB allocated per (pool, device) over the namespace's claims."""
    held: dict[tuple[str, str], int] = defaultdict(int)
    for claim in client.ResourceV1Api(api).list_namespaced_resource_claim(namespace).items:
        obj = api.sanitize_for_serialization(claim)
        for result in (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results", []):
            if result.get("driver") == DRIVER:
                memory = (result.get("consumedCapacity") or {}).get("memory", f"{CARD_MIB}Mi")
                held[(result["pool"], result["device"])] += int(parse_quantity(memory) / MIB)
    return dict(held)


def test_a_small_claim_joins_the_partly_used_card_instead_of_the_node_default_scoring_prefers(
        control_plane: ControlPlane, two_gpu_nodes: tuple[str, str], kube_api_client: client.ApiClient,
        core_v1: client.CoreV1Api, namespace: str, tmp_path: Path) -> None:
    a, b = two_gpu_nodes
    resource = client.ResourceV1Api(kube_api_client)
    control_plane.restart_scheduler([])  # the plain scheduler: the DRA path as it was

    def placed(pod: str, claim: str, memory: str, **kw: Any) -> str:
        resource.create_namespaced_resource_claim(namespace, claim_manifest(claim, memory))
        core_v1.create_namespaced_pod(namespace, claim_pod(pod, claim, (a, b), **kw))
        return wait_for(lambda: bound_node(core_v1, namespace, pod), timeout=60, what=f"pod {pod} bound",
                        explain=lambda: str(core_v1.read_namespaced_pod(pod, namespace).status.conditions))

    assert placed("held", "held", "8Gi", cpu="6", pinned=a) == a
    assert placed("spread", "spread", "4Gi") == b, "default scoring spreads to the node with less CPU requested"

    extender = FlaggedExtender(control_plane.kubeconfig, tmp_path / "extender.log", extra_args=("--dra-claims",))
    extender.start()
    try:
        control_plane.restart_scheduler([ExtenderConfig(
            url_prefix=extender.url, filter_verb="filter", prioritize_verb=None, bind_verb="bind",
            node_cache_capable=True, managed_resources=(), http_timeout_s=10.0)])
        wait_for(lambda: filter_reason(extender, [("main", {"gpupool.io/gpu-mem": "4"})], a) is None, timeout=30,
                 what=f"node {a} in the extender's ledger ({extender.log_path})")
        assert placed("packed", "packed", "4Gi") == a, f"gpupool packs it beside the 8 GiB claim ({extender.log_path})"
        pod = core_v1.read_namespaced_pod("packed", namespace)
        assert ResourceNames().assignment not in (pod.metadata.annotations or {}), "the claim books it, not the bind"
        held = allocated_mib(kube_api_client, namespace)
        assert held == {(a, "gpu-0"): 12 * 1024, (b, "gpu-0"): 4 * 1024}
        assert all(mib <= CARD_MIB for mib in held.values())
    finally:
        extender.kill()
        control_plane.restart_scheduler([])
