"""One ledger end to end (issue 24): the extender books DRA claims beside extended-resource pods.

Everything real on the default Kubernetes (v1.37.2): kube-scheduler's DRA allocator places claims and
calls a ``gpupool extender --dra-claims`` for gpupool's extended resources; a kubelet (fake runtime)
runs the node; ``gpupool node-agent --dra`` serves the device plugin and the DRA driver for one
8 GiB card.

A 6 GiB claim is allocated and prepared. The extender books it from the claim's status: its ledger
has 6 GiB of the card in use, so a 4 GiB extended-resource pod is not placed (Pending with the
extender's reason) while a 2 GiB one is placed and runs. The card now holds 8 GiB; a 2 GiB claim,
which the DRA allocator still puts on the card (it does not see extended-resource pods), is refused
by the agent at prepare and its pod stays Pending: the card is never over-committed. Deleting the
6 GiB claim's pod and claim gives its memory back in the extender's ledger, and the 4 GiB pod it
refused is placed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from kubernetes import client

from gpupool.api.names import ResourceNames
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.dra_support import claim_manifest, claim_pod, dra_installed, node_slice
from tests.e2e.e2e_support import NodeAgentProcess, StartKubelet, gpu_pod_manifest, wait_for
from tests.e2e.trust_support import FlaggedExtender, filter_reason, scheduled_through

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
GPUS = """\
model: Tesla-T4
cards:
  - {uuid: GPU-one-ledger-0000, memoryMiB: 8192}
"""
GIB = 1 << 30


def gib_of_a_card(gib: int) -> list[tuple[str, Mapping[str, str]]]:
    """One container asking ``gib`` GiB of a card (gpu-mem counts 256 MiB units)."""
    return [("main", {NAMES.gpu_mem: str(gib * 4)})]


@pytest.fixture
def ledger_extender(control_plane: ControlPlane, tmp_path: Path) -> Iterator[FlaggedExtender]:
    """An extender booking DRA claims, the scheduler calling it for gpupool's resources, and the
    resourceclaim controller (it deallocates a claim whose pods are gone, as on a real cluster)."""
    control_plane.start_controllers(("resourceclaim-controller",))
    try:
        yield from scheduled_through(control_plane, FlaggedExtender(
            control_plane.kubeconfig, tmp_path / "extender.log", extra_args=("--dra-claims",)))
    finally:
        control_plane.stop_controllers()


def test_a_claim_and_an_extended_resource_pod_never_over_commit_one_card(
        ledger_extender: FlaggedExtender, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
        namespace: str, start_kubelet: StartKubelet, start_node_agent: Callable[..., NodeAgentProcess]) -> None:
    extender = ledger_extender
    node = f"one-ledger-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(node)
    args = ("--dra", "--dra-kubelet-dir", str(kubelet.root_dir), "--cdi-dir", str(kubelet.directory / "cdi"),
            "--no-usage-monitor")
    agent = start_node_agent(kubelet, GPUS, extra_args=args)
    with dra_installed(kube_api_client, node) as resource:
        wait_for(lambda: node_slice(kube_api_client, node), timeout=60, what=f"the agent's slice ({agent.log_path})")
        wait_for(lambda: (core_v1.read_node(node).status.allocatable or {}).get(NAMES.gpu_mem) == "32",
                 timeout=60, what="the device plugin's memory units")
        wait_for(lambda: filter_reason(extender, gib_of_a_card(8), node) is None, timeout=30,
                 what=f"the node passing the extender's filter ({extender.log_path})")

        def phase(pod: str) -> str:
            return str(core_v1.read_namespaced_pod(pod, namespace).status.phase)

        resource.create_namespaced_resource_claim(namespace, claim_manifest("claim-big", "6Gi"))
        core_v1.create_namespaced_pod(namespace, claim_pod("dra-big", "claim-big", node))
        wait_for(lambda: phase("dra-big") == "Running", timeout=90, what=f"dra-big Running ({agent.log_path})")

        # the extender booked the claim from its status: 6 GiB of the card are used in its ledger
        wait_for(lambda: extender.metric("gpupool_cluster_gpu_memory_allocated_bytes") == 6 * GIB, timeout=30,
                 what=f"the claim in the extender's ledger ({extender.log_path})")
        reason = filter_reason(extender, gib_of_a_card(4), node)
        assert reason is not None and "largest free 2048 MiB" in reason, reason

        core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("er-4g", gib_of_a_card(4), node=node))
        core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("er-2g", gib_of_a_card(2), node=node))
        wait_for(lambda: phase("er-2g") == "Running", timeout=60, what=f"er-2g Running ({extender.log_path})")

        def unschedulable(pod: str) -> str | None:
            status = core_v1.read_namespaced_pod(pod, namespace).status
            for cond in status.conditions or []:
                if cond.type == "PodScheduled" and cond.reason == "Unschedulable":
                    return str(cond.message)
            return None

        message = wait_for(lambda: unschedulable("er-4g"), timeout=60, what="er-4g refused by the extender")
        assert core_v1.read_namespaced_pod("er-4g", namespace).spec.node_name is None, message

        # the allocator does not see er-2g: it places a 2 GiB claim on the full card; the agent refuses it
        resource.create_namespaced_resource_claim(namespace, claim_manifest("claim-late", "2Gi"))
        core_v1.create_namespaced_pod(namespace, claim_pod("dra-late", "claim-late", node))

        def refused() -> str | None:
            events = core_v1.list_namespaced_event(namespace, field_selector="involvedObject.name=dra-late").items
            messages = [e.message for e in events if e.reason == "FailedPrepareDynamicResources"]
            return messages[0] if messages else None

        refusal = wait_for(refused, timeout=90, what=f"dra-late's prepare refused ({agent.log_path})")
        assert "would be over-committed: 2048 MiB" in refusal and f"{namespace}/er-2g" in refusal, refusal
        assert phase("dra-late") == "Pending" and phase("er-2g") == "Running" and phase("dra-big") == "Running"

        # the claims go (their pods deleted, the controller deallocates them): the extender gives
        # their memory back, and er-4g, which it refused, is placed without a cluster event of its own.
        # A graceful deletion, as a cluster's controllers delete: kubelet unprepares a pod's claims
        # before it lets the API remove the pod (kubelet.go, SyncTerminatedPod), so the controller
        # deallocates them only once the node gave them back. A forced one (grace 0) removes the pod
        # at once: the claim is deallocated while the node still holds it, and an Allocate for er-4g
        # that came first would be refused by the node agent (its card still full) and fail the pod.
        for pod in ("dra-late", "dra-big"):
            core_v1.delete_namespaced_pod(pod, namespace, grace_period_seconds=1)
        for claim in ("claim-late", "claim-big"):
            resource.delete_namespaced_resource_claim(claim, namespace)
        wait_for(lambda: not resource.list_namespaced_resource_claim(namespace).items, timeout=60,
                 what="the claims deallocated and deleted")

        def why_not_placed() -> str:
            pod = core_v1.read_namespaced_pod("er-4g", namespace)
            conditions = [(c.type, c.status, c.reason, c.message) for c in pod.status.conditions or []]
            lines = [line for line in extender.log_path.read_text(errors="replace").splitlines()
                     if "er-4g" in line or "dra_bookings" in line or "wakeup" in line or "booking_problems" in line]
            return (f"er-4g on {pod.spec.node_name!r}, annotations {pod.metadata.annotations}, conditions "
                    f"{conditions}; extender alive: {extender.proc is not None and extender.proc.poll() is None}; "
                    f"filter now: {filter_reason(extender, gib_of_a_card(4), node)!r}\n" + "\n".join(lines[-40:]))

        wait_for(lambda: phase("er-4g") == "Running", timeout=90,
                 what=f"er-4g placed once the claims are gone ({extender.log_path})", explain=why_not_placed)
        assert extender.metric("gpupool_cluster_gpu_memory_allocated_bytes") == 6 * GIB  # er-2g and er-4g
