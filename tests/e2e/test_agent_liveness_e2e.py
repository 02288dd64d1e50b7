"""Node agent liveness end to end: kill the agent, the extender stops placing GPU pods on its node once
its Lease lapses; start it again, pods go there again.

Everything real (the test environment's Kubernetes, v1.37.2): kube-scheduler calls a ``gpupool extender``
process watching the agent Leases, a kubelet runs the node, ``gpupool node-agent --fake-gpus``
serves its device plugins and renews ``gpupool-agent-<node>`` every 0.5 s with a 3 s duration.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from gpupool.api.agent_lease import lease_name
from gpupool.api.annotations import decode_inventory
from gpupool.api.names import ResourceNames
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import NodeAgentProcess, StartKubelet, gpu_pod_manifest, wait_for
from tests.e2e.trust_support import FlaggedExtender, filter_reason, scheduled_through

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
GPUS = """\
model: Tesla-T4
cards:
  - {uuid: GPU-live-0000, memoryMiB: 16384}
  - {uuid: GPU-live-0001, memoryMiB: 16384}
"""
LEASE_S = 3
RENEW_S = 0.5
SLICE = [("main", {NAMES.gpu_mem: "8", NAMES.gpu_core: "10"})]


@pytest.fixture
def live_extender(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[FlaggedExtender]:
    """An extender watching the agent Leases of the test namespace, and the scheduler calling it."""
    yield from scheduled_through(control_plane, FlaggedExtender(
        control_plane.kubeconfig, tmp_path / "extender.log", extra_args=("--agent-lease-namespace", namespace)))


def failed_reason(extender: FlaggedExtender, node: str) -> str | None:
    """The extender's filter reason for ``node`` about a GPU pod (None: it passes)."""
    return filter_reason(extender, SLICE, node)


def phase(core_v1: client.CoreV1Api, namespace: str, name: str) -> tuple[str | None, str]:
    pod = core_v1.read_namespaced_pod(name, namespace)
    return pod.spec.node_name, str(pod.status.phase)


def test_a_dead_agent_gets_no_new_gpu_pods_until_it_renews_again(
        live_extender: FlaggedExtender, core_v1: client.CoreV1Api, namespace: str,
        start_kubelet: StartKubelet, start_node_agent: Callable[..., NodeAgentProcess]) -> None:
    extender = live_extender
    node = f"live-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(node)
    agent = start_node_agent(kubelet, GPUS, ("--lease-namespace", namespace, "--lease-duration", str(LEASE_S),
                                             "--lease-renew-interval", str(RENEW_S), "--no-usage-monitor"))

    def gpu_ready() -> bool:
        assert agent.running(), agent.log()
        status = core_v1.read_node(node)
        text = (status.metadata.annotations or {}).get(NAMES.inventory)
        return ((status.status.allocatable or {}).get(NAMES.gpu) == "2" and text is not None
                and len(decode_inventory(text).cards) == 2)

    wait_for(gpu_ready, timeout=90, what=f"the agent's devices on {node}:\n{agent.log()}")
    leases = client.CoordinationV1Api(core_v1.api_client)
    wait_for(lambda: leases.list_namespaced_lease(namespace).items, timeout=20, what="the agent's Lease")
    assert leases.read_namespaced_lease(lease_name(node), namespace).spec.holder_identity == node
    wait_for(lambda: failed_reason(extender, node) is None, timeout=20, what="the node passing filter")

    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("before", SLICE))
    wait_for(lambda: phase(core_v1, namespace, "before") == (node, "Running"), timeout=60, what="'before' Running")

    # the agent dies: after the Lease's duration filter refuses the node, saying why
    assert agent.proc is not None
    agent.proc.kill()
    agent.proc.wait(10)
    killed = time.monotonic()
    reason = wait_for(lambda: failed_reason(extender, node), timeout=LEASE_S + 10, what="the node refused")
    lapse_s = time.monotonic() - killed
    assert f"node agent on {node} last renewed" in reason and f"(lease {LEASE_S} s)" in reason
    assert lapse_s <= LEASE_S + 2.0, lapse_s
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("during", SLICE))

    def refused_message() -> str | None:
        pod = core_v1.read_namespaced_pod("during", namespace)
        for cond in pod.status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False" and "node agent on" in (cond.message or ""):
                return str(cond.message)
        return None

    wait_for(refused_message, timeout=30, what="'during' unschedulable with the extender's reason")
    time.sleep(2 * LEASE_S)
    assert phase(core_v1, namespace, "during")[0] is None, "a GPU pod went to a node whose agent is dead"

    # the agent comes back: the node takes GPU pods again, the waiting one included
    agent.start()
    restarted = time.monotonic()
    wait_for(lambda: failed_reason(extender, node) is None, timeout=30, what="the node passing filter again")
    resumed_s = time.monotonic() - restarted
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("after", SLICE))
    wait_for(lambda: phase(core_v1, namespace, "after") == (node, "Running"), timeout=60, what="'after' Running")
    wait_for(lambda: phase(core_v1, namespace, "during") == (node, "Running"), timeout=120,
             what="'during' Running once the agent is back")
    print(f"\nlease {LEASE_S} s: refused {lapse_s:.1f} s after the kill; passing again {resumed_s:.1f} s "
          f"after the restart (agent start-up included)")
