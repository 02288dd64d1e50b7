"""A pod whose grant the node refuses is replaced by its controller and runs on a card that works.

Everything real (the test environment's Kubernetes, v1.37.2): kube-scheduler calls a ``gpupool extender``
process, kube-controller-manager runs the Deployment and ReplicaSet controllers, a kubelet runs the
node with the fake runtime, and ``gpupool node-agent --fake-gpus`` serves its device plugins.

The node's card 0 is unhealthy (the fake GPU file), but the extender decides from a stale view in
which it is healthy (the test writes the node's inventory as it was before the card failed), and
card 0, the smaller one, is where binpack puts the pod. kubelet admits the pod (card 1's devices
are healthy and free) and calls Allocate; the agent checks the assignment against its cards,
refuses it, and says why on the pod (``GpuAssignmentRefused``); kubelet fails the pod with
``UnexpectedAdmissionError``. The agent publishes its cards again, the ReplicaSet creates a
replacement, and the extender places it on card 1, where it runs.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from gpupool.api.annotations import Inventory, decode_assignment, decode_inventory, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import ExtenderProcess, NodeAgentProcess, StartKubelet, wait_for

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
REFUSED_REASON = "GpuAssignmentRefused"
GPUS = """\
model: Tesla-T4
cards:
  - {uuid: GPU-refuse-0000, memoryMiB: 8192, healthy: false}
  - {uuid: GPU-refuse-0001, memoryMiB: 16384}
"""
#: 4 GiB: fits either card, and binpack prefers the tighter one, card 0.
LIMITS = {NAMES.gpu_mem: "16"}


@pytest.fixture
def controllers(control_plane: ControlPlane, namespace: str) -> Iterator[None]:
    """Deployment and ReplicaSet controllers for this test; its workloads are deleted before they stop
    (nothing garbage-collects them), and they stop before the namespace's pods are force-deleted."""
    control_plane.start_controllers()
    try:
        yield
    finally:
        control_plane.stop_controllers()


def deployment(name: str) -> dict[str, object]:
    labels = {"app": name}
    container = {"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"],
                 "resources": {"limits": LIMITS}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [container], "terminationGracePeriodSeconds": 1}}}}


def test_a_refused_pod_is_replaced_and_the_replacement_runs_on_a_working_card(
        gpupool_extender: ExtenderProcess, controllers: None, core_v1: client.CoreV1Api,
        kube_api_client: client.ApiClient, namespace: str, start_kubelet: StartKubelet,
        start_node_agent: Callable[..., NodeAgentProcess]) -> None:
    apps = client.AppsV1Api(kube_api_client)
    kubelet = start_kubelet(f"refuse-{uuid.uuid4().hex[:6]}")
    node = kubelet.node_name
    agent = start_node_agent(kubelet, GPUS)

    def published() -> Inventory | None:
        assert agent.running(), agent.log()
        text = (core_v1.read_node(node).metadata.annotations or {}).get(NAMES.inventory)
        inventory = decode_inventory(text) if text else None
        return inventory if inventory is not None and not inventory.cards[0].healthy else None

    truth = wait_for(published, timeout=60, what=f"the agent's inventory of {node}:\n{agent.log()}")
    stale = Inventory(tuple(dataclasses.replace(c, healthy=True) for c in truth.cards), truth.topology)
    core_v1.patch_node(node, {"metadata": {"annotations": {NAMES.inventory: encode_inventory(stale)}}})
    wait_for(lambda: core_v1.read_node(node).status.allocatable.get(NAMES.gpu_mem) == "64", timeout=60,
             what="card 1's devices in the node's allocatable")

    apps.create_namespaced_deployment(namespace, deployment("trainer"))
    try:
        def pods() -> list[client.V1Pod]:
            return list(core_v1.list_namespaced_pod(namespace, label_selector="app=trainer").items)

        def replaced_and_running() -> client.V1Pod | None:
            for pod in pods():
                if pod.status.phase == "Running":
                    return pod
            return None

        running = wait_for(replaced_and_running, timeout=120,
                           what=f"a running replacement; pods: {[(p.metadata.name, p.status.phase) for p in pods()]}"
                                f"\n{agent.log()}")
        failed = [p for p in pods() if p.status.phase == "Failed"]
        assert failed, "the first pod should have been refused"
        assert all(p.status.reason == "UnexpectedAdmissionError" for p in failed), [p.status for p in failed]
        refused = failed[0]

        def refusal_event() -> client.CoreV1Event | None:
            events = core_v1.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={refused.metadata.name}").items
            return next((e for e in events if e.reason == REFUSED_REASON), None)

        event = wait_for(refusal_event, timeout=30, what=f"the {REFUSED_REASON} event")
        assert "card 0 (GPU-refuse-0000)" in event.message and "unhealthy" in event.message, event.message
        assert decode_assignment(refused.metadata.annotations[NAMES.assignment]).containers[0].cards[0].index == 0
        owner = running.metadata.owner_references[0]
        assert owner.kind == "ReplicaSet" and owner.name == refused.metadata.owner_references[0].name
        placed = decode_assignment(running.metadata.annotations[NAMES.assignment])
        assert placed.node == node and [c.index for c in placed.containers[0].cards] == [1]
    finally:
        apps.delete_namespaced_deployment("trainer", namespace)
        apps.delete_collection_namespaced_replica_set(namespace)
