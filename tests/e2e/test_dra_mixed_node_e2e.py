"""A node that takes both kinds of gpupool pods: DRA claims (kube-scheduler's allocator chooses the
card) and extended-resource pods (bound here with the ``assignment-v1`` the extender would write),
on one 8 GiB card, with a real kubelet (fake runtime) and ``gpupool node-agent --dra``.

Without the extender (these pods are bound by hand, and the DRA allocator never sees extended-resource
pods), the node agent refuses what would over-commit the card, both ways, by the core's card rule
(docs/dra.md, "One ledger"): with a 6 GiB claim
prepared, a 4 GiB extended-resource pod is refused at Allocate (kubelet fails its admission with
the agent's reason, the claim named) while a 2 GiB one runs; then a 2 GiB claim, which the DRA
allocator still places on the card, is refused at prepare (kubelet's FailedPrepareDynamicResources
event carries the agent's reason, the device-plugin pod named).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.annotations import Assignment, encode_assignment
from gpupool.api.names import ResourceNames
from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, NodeSpec, Placement
from tests.e2e.dra_support import claim_manifest, claim_pod, dra_installed, node_slice
from tests.e2e.e2e_support import NodeAgentProcess, StartKubelet, wait_for

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
CARD_UUID = "GPU-dra-mixed-0000"
GPUS = f"""\
model: Tesla-T4
cards:
  - {{uuid: {CARD_UUID}, memoryMiB: 8192}}
"""


def plugin_pod(name: str, node: str, memory_mib: int) -> dict[str, Any]:
    """An extended-resource pod bound to ``node`` with the extender's assignment of ``memory_mib``
    on card 0."""
    spec = NodeSpec(node, cpu_milli=1000, memory_mib=1024, cards=(GpuCard(0, CARD_UUID, "Tesla-T4", 8192),))
    placement = Placement(name, node, 0, 0, (ContainerAssignment("main", (CardSlice(0, memory_mib, 0),)),))
    assignment = Assignment.from_placement(placement, spec, dt.datetime.now(dt.UTC))
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {NAMES.assignment: encode_assignment(assignment)}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"],
                                     "resources": {"limits": {NAMES.gpu_mem: str(memory_mib // 256)}}}]}}


def test_the_agent_never_over_commits_a_card_shared_by_both_paths(
        kube_api_client: client.ApiClient, core_v1: client.CoreV1Api, namespace: str,
        start_kubelet: StartKubelet, start_node_agent: Any) -> None:
    node = f"dra-mix-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(node)
    args = ("--dra", "--dra-kubelet-dir", str(kubelet.root_dir), "--cdi-dir", str(kubelet.directory / "cdi"))
    agent: NodeAgentProcess = start_node_agent(kubelet, GPUS, extra_args=args)
    with dra_installed(kube_api_client, node) as resource:
        wait_for(lambda: node_slice(kube_api_client, node), timeout=60, what="the agent's ResourceSlice")
        wait_for(lambda: (core_v1.read_node(node).status.allocatable or {}).get(NAMES.gpu_mem) == "32",
                 timeout=60, what="the device plugin's memory units")

        def phase(pod: str) -> str:
            return str(core_v1.read_namespaced_pod(pod, namespace).status.phase)

        resource.create_namespaced_resource_claim(namespace, claim_manifest("claim-big", "6Gi"))
        core_v1.create_namespaced_pod(namespace, claim_pod("dra-big", "claim-big", node))
        wait_for(lambda: phase("dra-big") == "Running", timeout=90, what=f"dra-big Running ({agent.log_path})")

        # Allocate counts the prepared claim: 4 GiB more would over-commit the card, 2 GiB fits
        core_v1.create_namespaced_pod(namespace, plugin_pod("plugin-4g", node, 4096))
        wait_for(lambda: phase("plugin-4g") == "Failed", timeout=60, what="plugin-4g refused at admission")
        status = core_v1.read_namespaced_pod("plugin-4g", namespace).status
        assert status.reason == "UnexpectedAdmissionError", (status.reason, status.message)
        assert "over-committed" in status.message and "claim claim-big" in status.message, status.message
        core_v1.create_namespaced_pod(namespace, plugin_pod("plugin-2g", node, 2048))
        wait_for(lambda: phase("plugin-2g") == "Running", timeout=60, what=f"plugin-2g Running ({agent.log_path})")

        # prepare counts the device plugin's pod: the allocator sees 2 GiB free, the agent sees none
        resource.create_namespaced_resource_claim(namespace, claim_manifest("claim-late", "2Gi"))
        core_v1.create_namespaced_pod(namespace, claim_pod("dra-late", "claim-late", node))

        def refused() -> str | None:
            events = core_v1.list_namespaced_event(namespace, field_selector="involvedObject.name=dra-late").items
            messages = [e.message for e in events if e.reason == "FailedPrepareDynamicResources"]
            return messages[0] if messages else None

        message = wait_for(refused, timeout=90, what=f"dra-late's prepare refused ({agent.log_path})")
        assert "would be over-committed: 2048 MiB" in message and f"{namespace}/plugin-2g" in message, message
        assert phase("dra-late") == "Pending"
