"""Preemption across the two paths (issue 24): a high-priority extended-resource pod preempts a
low-priority DRA claim pod, and a high-priority claim pod preempts a low-priority extended-resource pod.

Everything real on the default Kubernetes: kube-scheduler (its DRA allocator places the claim) calls
``gpupool extender --dra-claims`` for filter, bind and preempt; the resourceclaim controller
deallocates a claim its pods no longer reserve; a kubelet (fake runtime) runs the node, and
``gpupool node-agent --dra`` serves the device plugin and the DRA driver for one 8 GiB card.

A 6 GiB claim's pod and a pod without GPUs that holds most of the node's CPU run at low priority.
The high-priority pod asks 4 GiB of the card and CPU the second pod holds: kube-scheduler's dry run
(blind to gpupool's resources) proposes only the CPU holder, which frees no card; the extender adds
the claim pod, whose claim is then freed in its model of the card. kube-scheduler deletes both,
kubelet unprepares the claim before the API removes its pod (a graceful deletion), the controller
deallocates it, the extender's claim watch releases the booking, and the high-priority pod is bound
to the card and runs. Without claim pods as victims the extender left the node out (the CPU holder
alone frees no GPU memory) and nobody was evicted.

The other way round, the preemptor's 4 GiB comes from a pending claim and a low-priority
extended-resource pod holds 6 GiB: the extender's preempt reads the claim as its filter does and
adds the GPU pod to kube-scheduler's CPU holder. Before it read a claim pod's extended resources
only (none): it kept the CPU holder alone, and the claim pod stayed Pending.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.names import ResourceNames
from gpupool.kube.quantity import parse_quantity
from gpupool.testenv.config import ExtenderConfig
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.dra_support import claim_manifest, claim_pod, dra_installed, node_slice
from tests.e2e.e2e_support import NodeAgentProcess, StartKubelet, gpu_pod_manifest, make_priority_classes, wait_for
from tests.e2e.trust_support import FlaggedExtender, filter_reason

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
GPUS = """\
model: Tesla-T4
cards:
  - {uuid: GPU-dra-preempt-0000, memoryMiB: 8192}
"""
GIB = 1 << 30
LOW, HIGH = 100, 100000


def scheduler_calling(extender: FlaggedExtender, managed: tuple[str, ...]) -> list[ExtenderConfig]:
    """kube-scheduler calling ``extender`` for filter, prioritize, bind and preempt; ``managed``
    empty: about every pod, claim pods included (as gpupool's scheduler with claim pods steered)."""
    return [ExtenderConfig(url_prefix=extender.url, filter_verb="filter", prioritize_verb="prioritize",
                           bind_verb="bind", preempt_verb="preempt", weight=5, node_cache_capable=True,
                           managed_resources=managed, http_timeout_s=10.0)]


@pytest.fixture
def preempting_extender(control_plane: ControlPlane, tmp_path: Path) -> Iterator[FlaggedExtender]:
    """An extender booking DRA claims, kube-scheduler calling it for filter, bind and preempt, and
    the resourceclaim controller."""
    control_plane.start_controllers(("resourceclaim-controller",))
    extender = FlaggedExtender(control_plane.kubeconfig, tmp_path / "extender.log", extra_args=("--dra-claims",))
    extender.start()
    try:
        control_plane.restart_scheduler(scheduler_calling(extender, NAMES.managed()))
        yield extender
    finally:
        extender.kill()
        control_plane.restart_scheduler([])
        control_plane.stop_controllers()


@pytest.fixture
def priority_classes(kube_api_client: client.ApiClient) -> Iterator[tuple[str, str]]:
    with make_priority_classes(kube_api_client, "dra", LOW, HIGH) as names:
        yield names


@contextmanager
def dra_node(extender: FlaggedExtender, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
             start_kubelet: StartKubelet, start_node_agent: Callable[..., NodeAgentProcess]) -> Iterator[DraNode]:
    """A kubelet and ``node-agent --dra`` serving one 8 GiB card, its slice published, its device
    plugin's units known and the extender's filter passing it."""
    name = f"dra-preempt-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(name)
    args = ("--dra", "--dra-kubelet-dir", str(kubelet.root_dir), "--cdi-dir", str(kubelet.directory / "cdi"),
            "--no-usage-monitor")
    agent = start_node_agent(kubelet, GPUS, extra_args=args)
    with dra_installed(kube_api_client, name) as resource:
        wait_for(lambda: node_slice(kube_api_client, name), timeout=60, what=f"the agent's slice ({agent.log_path})")
        wait_for(lambda: (core_v1.read_node(name).status.allocatable or {}).get(NAMES.gpu_mem) == "32",
                 timeout=60, what="the device plugin's memory units")
        wait_for(lambda: filter_reason(extender, [("main", {NAMES.gpu_mem: "32"})], name) is None, timeout=30,
                 what=f"the node passing the extender's filter ({extender.log_path})")
        cpu_milli = int(parse_quantity(core_v1.read_node(name).status.allocatable["cpu"]) * 1000)
        assert cpu_milli >= 1000, cpu_milli
        yield DraNode(name, resource, cpu_milli, agent.log_path)


@dataclass(frozen=True)
class DraNode:
    name: str
    resource: Any
    """The resource.k8s.io client (claims)."""
    cpu_milli: int
    agent_log: Path


def phase(core_v1: client.CoreV1Api, namespace: str, pod: str) -> str:
    return str(core_v1.read_namespaced_pod(pod, namespace).status.phase)


def cpu_hog(node: DraNode, priority_class: str) -> dict[str, Any]:
    """A pod without GPUs holding all but 400m of the node's CPU: kube-scheduler's dry run needs it."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu-hog"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node.name}, "priorityClassName": priority_class,
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"],
                                     "resources": {"requests": {"cpu": f"{node.cpu_milli - 400}m"}}}]}}


def explain(core_v1: client.CoreV1Api, namespace: str, extender: FlaggedExtender) -> Callable[[], str]:
    def why_not() -> str:
        pods = {p.metadata.name: (p.status.phase, p.spec.node_name, p.metadata.deletion_timestamp)
                for p in core_v1.list_namespaced_pod(namespace).items}
        lines = [line for line in extender.log_path.read_text(errors="replace").splitlines()
                 if "preempt" in line or "claim" in line or "urgent" in line]
        return f"pods {pods}\n" + "\n".join(lines[-30:])
    return why_not


def test_a_high_priority_pod_evicts_the_claim_pod_holding_its_card(
        preempting_extender: FlaggedExtender, priority_classes: tuple[str, str], kube_api_client: client.ApiClient,
        core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet,
        start_node_agent: Callable[..., NodeAgentProcess]) -> None:
    extender = preempting_extender
    low, high = priority_classes
    with dra_node(extender, kube_api_client, core_v1, start_kubelet, start_node_agent) as node:
        resource = node.resource
        resource.create_namespaced_resource_claim(namespace, claim_manifest("claim-low", "6Gi"))
        holder = claim_pod("dra-low", "claim-low", node.name)
        holder["spec"]["priorityClassName"] = low
        holder["spec"]["terminationGracePeriodSeconds"] = 1  # kubelet unprepares before the API removes it
        core_v1.create_namespaced_pod(namespace, holder)
        core_v1.create_namespaced_pod(namespace, cpu_hog(node, low))
        wait_for(lambda: {phase(core_v1, namespace, p) for p in ("dra-low", "cpu-hog")} == {"Running"}, timeout=90,
                 what=f"the low-priority pods Running ({node.agent_log})")
        wait_for(lambda: extender.metric("gpupool_cluster_gpu_memory_allocated_bytes") == 6 * GIB, timeout=30,
                 what=f"the claim in the extender's ledger ({extender.log_path})")

        urgent = gpu_pod_manifest("urgent", [("main", {NAMES.gpu_mem: "16"})], node=node.name)  # 4 GiB
        urgent["spec"]["priorityClassName"] = high
        urgent["spec"]["containers"][0].setdefault("resources", {})["requests"] = {"cpu": "800m"}
        core_v1.create_namespaced_pod(namespace, urgent)

        wait_for(lambda: phase(core_v1, namespace, "urgent") == "Running", timeout=120,
                 what=f"the high-priority pod Running ({extender.log_path})",
                 explain=explain(core_v1, namespace, extender))
        left = {p.metadata.name for p in core_v1.list_namespaced_pod(namespace).items
                if p.metadata.deletion_timestamp is None}  # dra-low may still be finishing its deletion
        assert left == {"urgent"}, left
        log = extender.log_path.read_text(errors="replace")
        named = [line for line in log.splitlines() if "preempt for pod" in line and "/urgent" in line]
        assert named and f"{namespace}/dra-low" in named[0] and f"{namespace}/claim:claim-low" in named[0], named
        claim = resource.read_namespaced_resource_claim("claim-low", namespace)
        assert claim.status is None or claim.status.allocation is None  # deallocated once its pod was gone
        assert extender.metric("gpupool_cluster_gpu_memory_allocated_bytes") == 4 * GIB


def test_a_high_priority_claim_pod_evicts_the_extended_resource_pod_holding_its_card(
        preempting_extender: FlaggedExtender, priority_classes: tuple[str, str], kube_api_client: client.ApiClient,
        core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet,
        start_node_agent: Callable[..., NodeAgentProcess], control_plane: ControlPlane) -> None:
    """The preemptor's share comes from a pending 4 GiB claim; a low-priority extended-resource pod
    holds 6 GiB of the card (the DRA allocator does not see it, so the claim's DRA filter passes and
    the extender's filter refuses the node). kube-scheduler's dry run proposes the CPU holder only;
    the extender reads the pod's claim as filter does and adds the GPU pod. kube-scheduler lists no
    managed resources, as gpupool's scheduler with claim pods steered: with them it would not send
    a claim pod to the extender at all (``HTTPExtender.IsInterested``); it is restarted so once the
    low-priority pods run (the extender binds no pod without GPUs, such as the CPU holder: a
    cluster's default scheduler places those)."""
    extender = preempting_extender
    low, high = priority_classes
    with dra_node(extender, kube_api_client, core_v1, start_kubelet, start_node_agent) as node:
        holder = gpu_pod_manifest("gpu-low", [("main", {NAMES.gpu_mem: "24"})], node=node.name)  # 6 GiB
        holder["spec"]["priorityClassName"] = low
        core_v1.create_namespaced_pod(namespace, holder)
        core_v1.create_namespaced_pod(namespace, cpu_hog(node, low))
        wait_for(lambda: {phase(core_v1, namespace, p) for p in ("gpu-low", "cpu-hog")} == {"Running"}, timeout=90,
                 what=f"the low-priority pods Running ({node.agent_log})")
        control_plane.restart_scheduler(scheduler_calling(extender, ()))

        node.resource.create_namespaced_resource_claim(namespace, claim_manifest("claim-urgent", "4Gi"))
        urgent = claim_pod("urgent", "claim-urgent", node.name)
        urgent["spec"]["priorityClassName"] = high
        urgent["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "800m"}
        core_v1.create_namespaced_pod(namespace, urgent)

        wait_for(lambda: phase(core_v1, namespace, "urgent") == "Running", timeout=120,
                 what=f"the high-priority claim pod Running ({extender.log_path})",
                 explain=explain(core_v1, namespace, extender))
        left = {p.metadata.name for p in core_v1.list_namespaced_pod(namespace).items
                if p.metadata.deletion_timestamp is None}
        assert left == {"urgent"}, left
        log = extender.log_path.read_text(errors="replace")
        named = [line for line in log.splitlines() if "preempt for pod" in line and "/urgent" in line]
        assert named and f"{namespace}/gpu-low" in named[0], named
        wait_for(lambda: extender.metric("gpupool_cluster_gpu_memory_allocated_bytes") == 4 * GIB, timeout=30,
                 what=f"only the claim booked ({extender.log_path})")
