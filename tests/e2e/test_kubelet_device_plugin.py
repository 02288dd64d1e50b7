"""gpupool's node agent registers its device plugins with a test-environment kubelet.

This checks the paths the test environment promises: a plugin on the host registers through
``Kubelet.kubelet_socket`` and serves from ``Kubelet.device_plugin_dir`` although kubelet itself
sees that directory as ``/var/lib/kubelet/device-plugins`` in its own mount namespace, and it
registers again after ``Kubelet.restart()``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from kubernetes import client

from gpupool.testenv.kubelet import Kubelet
from tests.e2e.e2e_support import NodeAgentProcess, StartKubelet, wait_for

# Also in the compatibility set run on the oldest supported Kubernetes minor (scripts/test-all).
pytestmark = [pytest.mark.e2e, pytest.mark.compat]

GPUS = """\
model: NVIDIA-H200
cards:
  - {uuid: GPU-e2e-aaaa, memoryMiB: 143771}
  - {uuid: GPU-e2e-bbbb, memoryMiB: 143771}
topology: [[0, 1]]
"""


#: Two 143,771 MiB cards: 561 units of 256 MiB each; a card offers one gpu-shared device per memory
#: unit and percent of compute (no card can hold more slices than that).
EXPECTED = {"gpupool.io/gpu": "2", "gpupool.io/gpu-mem": "1122", "gpupool.io/gpu-core": "200",
            "gpupool.io/gpu-shared": "1322"}


@pytest.fixture
def kubelet(start_kubelet: StartKubelet) -> Kubelet:
    return start_kubelet(f"e2e-plugin-{uuid.uuid4().hex[:6]}")


@pytest.fixture
def node_agent(kubelet: Kubelet, start_node_agent: Callable[..., NodeAgentProcess]) -> str:
    return str(start_node_agent(kubelet, GPUS).log_path)


def test_node_agent_registers_through_the_host_paths_and_again_after_a_kubelet_restart(
    core_v1: client.CoreV1Api, kubelet: Kubelet, node_agent: str
) -> None:
    def gpupool_allocatable() -> dict[str, str] | None:
        """All four gpupool resources once every plugin has registered (they register one by one)."""
        allocatable = core_v1.read_node(kubelet.node_name).status.allocatable or {}
        found = {k: v for k, v in allocatable.items() if k.startswith("gpupool.io/") and v != "0"}
        return found if found.keys() == EXPECTED.keys() else None

    before = wait_for(gpupool_allocatable, timeout=60,
                      what=f"gpupool.io resources on the node (agent log: {node_agent})")
    plugin_sockets = {p.name for p in kubelet.device_plugin_dir.iterdir()} - {"kubelet.sock"}
    assert any(name.endswith(".sock") for name in plugin_sockets), plugin_sockets

    kubelet.restart()  # wipes the plugin directory; the agent must notice and register again

    def registered_again() -> bool:
        names = {p.name for p in kubelet.device_plugin_dir.iterdir()}
        return bool(names & plugin_sockets)

    wait_for(registered_again, timeout=60, what=f"plugin sockets re-created (agent log: {node_agent})")
    after = wait_for(gpupool_allocatable, timeout=60, what="gpupool.io resources after the restart")
    assert before == after == EXPECTED
