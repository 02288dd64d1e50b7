"""gpupool's node agent registers its device plugins with a test-environment kubelet.

This checks the paths the test environment promises: a plugin on the host registers through
``Kubelet.kubelet_socket`` and serves from ``Kubelet.device_plugin_dir`` although kubelet itself
sees that directory as ``/var/lib/kubelet/device-plugins`` in its own mount namespace, and it
registers again after ``Kubelet.restart()``.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import StartKubelet, wait_for
from kubernetes import client

from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.kubelet import Kubelet

pytest.importorskip("gpupool.services.node_agent", reason="gpupool node agent not available")

pytestmark = pytest.mark.e2e

GPUS = """\
model: NVIDIA-H200
cards:
  - {uuid: GPU-e2e-aaaa, memoryMiB: 143771}
  - {uuid: GPU-e2e-bbbb, memoryMiB: 143771}
topology: [[0, 1]]
"""


@pytest.fixture
def kubelet(start_kubelet: StartKubelet) -> Kubelet:
    return start_kubelet(f"e2e-plugin-{uuid.uuid4().hex[:6]}")


@pytest.fixture
def node_agent(kubelet: Kubelet, control_plane: ControlPlane, tmp_path: Path) -> Iterator[Path]:
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(GPUS)
    log = tmp_path / "node-agent.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from gpupool.cli.main import main; main()", "node-agent",
             "--node-name", kubelet.node_name, "--fake-gpus", str(gpus),
             "--plugin-dir", str(kubelet.device_plugin_dir),
             "--pod-resources-socket", str(kubelet.pod_resources_socket),
             "--kubeconfig", str(control_plane.kubeconfig)],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        yield log
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_node_agent_registers_through_the_host_paths_and_again_after_a_kubelet_restart(
    core_v1: client.CoreV1Api, kubelet: Kubelet, node_agent: Path
) -> None:
    def gpupool_allocatable() -> dict[str, str] | None:
        allocatable = core_v1.read_node(kubelet.node_name).status.allocatable or {}
        found = {k: v for k, v in allocatable.items() if k.startswith("gpupool.io/") and v != "0"}
        return found or None

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
    assert after == before
