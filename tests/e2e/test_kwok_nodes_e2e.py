"""KWOK's simulated nodes carry gpupool's inventory through the real kube-scheduler and extender.

Twenty nodes publish the ``inventory-v1`` annotation and gpupool's extended resources, as the node
agent would, and carry KWOK's annotation; KWOK (``gpupool.testenv.kwok``) makes them Ready, renews
their Leases and plays their kubelet for the pods bound to them. What it proves: GPU pods are
filtered and bound by ``gpupool extender`` onto those nodes and become Running (KWOK's status: a pod
IP, the containers running); and under the node lifecycle controller the KWOK nodes stay Ready past
its grace period (50 s in v1.37; 40 s before 1.32) because KWOK renews their Leases, while a bare
Node object beside them, Ready at creation and never renewed, turns Unknown in the same time.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.annotations import Inventory, decode_assignment, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.errors import BuildImpossibleError
from gpupool.testenv.kwok import MANAGED_ANNOTATION, ensure_kwok, start_kwok
from gpupool.testenv.procs import ManagedProcess
from tests.e2e.e2e_support import ExtenderProcess, MakeNode, condition, pod_manifest, wait_for

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
NODES = 20
CARDS = 4
CARD_MIB = 16384
UNITS = CARD_MIB // 256
#: kube-controller-manager v1.37's --node-monitor-grace-period default, and its monitor period.
GRACE_S = 50
MONITOR_S = 5


@pytest.fixture(scope="module")
def kwok(control_plane: ControlPlane) -> Iterator[ManagedProcess]:
    """KWOK for this module's nodes; stopped before the session's control plane."""
    try:
        install = ensure_kwok(log=lambda m: print(f"[gpupool testenv] {m}", flush=True))
    except BuildImpossibleError as exc:
        pytest.skip(f"KWOK cannot be built on this machine: {exc}")
    process = start_kwok(control_plane, name=f"kwok-{uuid.uuid4().hex[:6]}", install=install)
    try:
        yield process
    finally:
        process.stop()


def kwok_gpu_node(make_node: MakeNode, name: str) -> str:
    cards = tuple(GpuCard(i, f"GPU-{name}-{i}", "Tesla-V100", CARD_MIB) for i in range(CARDS))
    allocatable = {"cpu": "64", "memory": "256Gi", "pods": "110", NAMES.gpu: str(CARDS),
                   NAMES.gpu_mem: str(CARDS * UNITS), NAMES.gpu_core: str(CARDS * 100),
                   NAMES.gpu_shared: str(CARDS * (UNITS + 100))}
    return make_node(name, allocatable, annotations={NAMES.inventory: encode_inventory(Inventory(cards)),
                                                     MANAGED_ANNOTATION[0]: MANAGED_ANNOTATION[1]})


def bare_ready_node(core_v1: client.CoreV1Api, name: str) -> None:
    """A Node created Ready (heartbeat now) that nobody renews: no kubelet, no KWOK annotation."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    core_v1.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                         "status": {"allocatable": {"cpu": "8", "memory": "8Gi", "pods": "10"},
                                    "capacity": {"cpu": "8", "memory": "8Gi", "pods": "10"},
                                    "conditions": [{"type": "Ready", "status": "True", "reason": "Test",
                                                    "lastHeartbeatTime": now, "lastTransitionTime": now}]}})


def ready_status(core_v1: client.CoreV1Api, name: str) -> str | None:
    ready = condition(core_v1.read_node(name), "Ready")
    return None if ready is None else str(ready.status)


def test_gpu_pods_on_kwok_nodes_run_and_the_nodes_stay_ready(
    control_plane: ControlPlane, gpupool_extender: ExtenderProcess, kwok: ManagedProcess,
    make_node: MakeNode, core_v1: client.CoreV1Api, namespace: str,
) -> None:
    control = f"bare-{uuid.uuid4().hex[:6]}"
    bare_ready_node(core_v1, control)
    control_plane.start_controllers(("nodelifecycle",))
    try:
        prefix = f"kwok-{uuid.uuid4().hex[:6]}"
        nodes = [kwok_gpu_node(make_node, f"{prefix}-{i:02d}") for i in range(NODES)]
        wait_for(lambda: all(ready_status(core_v1, n) == "True" for n in nodes), timeout=60,
                 what="KWOK to make its nodes Ready")

        shapes: list[dict[str, str]] = [{NAMES.gpu: "1"}, {NAMES.gpu_mem: str(UNITS // 4), NAMES.gpu_core: "25"}]
        pods = [f"gpu-{i:02d}" for i in range(2 * NODES)]
        for i, name in enumerate(pods):
            core_v1.create_namespaced_pod(namespace, pod_manifest(name, limits=shapes[i % 2]))

        def running() -> list[Any] | None:
            listed = [p for p in core_v1.list_namespaced_pod(namespace).items if p.metadata.name in pods]
            done = [p for p in listed if p.spec.node_name and p.status.phase == "Running"]
            return done if len(done) == len(pods) else None

        placed = wait_for(running, timeout=120, what="every GPU pod bound by the extender and Running (KWOK)")
        for pod in placed:
            assert pod.spec.node_name in nodes
            assignment = decode_assignment(pod.metadata.annotations[NAMES.assignment])
            assert assignment.node == pod.spec.node_name
            assert pod.status.pod_ip and all(s.state.running for s in pod.status.container_statuses)

        # The lifecycle controller marks the renewed-by-nobody node Unknown after its grace period;
        # in the same time the KWOK nodes' Leases were renewed and they stayed Ready.
        wait_for(lambda: ready_status(core_v1, control) == "Unknown", timeout=GRACE_S + 4 * MONITOR_S + 30,
                 what=f"the node lifecycle controller to mark the bare node {control} Unknown", interval=1.0)
        assert {n: ready_status(core_v1, n) for n in nodes} == dict.fromkeys(nodes, "True")
        coordination = client.CoordinationV1Api(core_v1.api_client)
        now = dt.datetime.now(dt.UTC)
        for name in nodes:
            lease = coordination.read_namespaced_lease(name, "kube-node-lease")
            assert lease.spec.lease_duration_seconds == 40
            assert (now - lease.spec.renew_time).total_seconds() < 20, name  # renewed every 10 s
    finally:
        control_plane.stop_controllers()
        core_v1.delete_node(control)
