"""A node agent that kubelet never accepted advertises nothing (issue: a wrong ``--plugin-dir``).

Before: the agent waited silently for a kubelet socket that would never appear, while it published
the node's GPU inventory and renewed its heartbeat Lease, so the extender placed GPU pods there and
they ran with no GPU grant. Now both wait for the device plugins' registration, and the agent says
what it waits for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.api.agent_lease import lease_name
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import MakeNode, NodeAgentProcess

pytestmark = [pytest.mark.e2e]

GPUS = "cards:\n  - {model: A100, memoryMiB: 40960}\n"
#: Long enough for an agent that publishes at start to have done so several times over.
OBSERVE_S = 4.0


@dataclass(frozen=True)
class NoKubelet:
    """What NodeAgentProcess reads of a kubelet: a node name and host paths where no kubelet is."""

    node_name: str
    device_plugin_dir: Path
    pod_resources_socket: Path


def test_an_agent_kubelet_never_registered_publishes_no_inventory_and_no_lease(
        control_plane: ControlPlane, core_v1: client.CoreV1Api, make_node: MakeNode, namespace: str,
        tmp_path: Path) -> None:
    node = make_node()
    wrong = NoKubelet(node, tmp_path / "not-the-device-plugins-dir", tmp_path / "pod-resources" / "kubelet.sock")
    agent = NodeAgentProcess(wrong, control_plane.kubeconfig, GPUS, tmp_path,  # type: ignore[arg-type]
                             ("--lease-namespace", namespace, "--lease-duration", "4",
                              "--lease-renew-interval", "0.5"))
    agent.start()
    try:
        deadline = time.monotonic() + OBSERVE_S
        while time.monotonic() < deadline:
            assert agent.running(), agent.log()
            annotations = core_v1.read_node(node).metadata.annotations or {}
            assert not any(key.endswith("/inventory-v1") for key in annotations), annotations
            with pytest.raises(ApiException) as missing:
                client.CoordinationV1Api(core_v1.api_client).read_namespaced_lease(lease_name(node), namespace)
            assert missing.value.status == 404
            time.sleep(0.5)
        assert "waiting for kubelet's registration socket " + str(wrong.device_plugin_dir / "kubelet.sock") \
            in agent.log(), agent.log()
    finally:
        agent.stop()
