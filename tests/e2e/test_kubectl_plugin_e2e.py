"""``kubectl gpupool`` run by the real ``kubectl`` client against the real kube-apiserver.

kubectl finds plugins as executables named ``kubectl-<name>`` on ``PATH``. Installed, that is the
``kubectl-gpupool`` console script of the package; here, where the package is imported from the
checkout, a two-line wrapper of the same name runs ``python -m gpupool.kubectl`` (the same entry
point) with this checkout on ``PYTHONPATH``. Nodes are kubelet-less API objects with an
``inventory-v1`` annotation; pods are bound by hand with their ``assignment-v1``, as a bind leaves them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import MakeNode
from tests.kubectl.objects import assignment

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
ROOT = Path(__file__).resolve().parents[2]
CARD_MIB = 16384
KUBECTL_TIMEOUT_S = 60


@pytest.fixture
def kubectl(tmp_path: Path, control_plane: ControlPlane) -> dict[str, str]:
    """The environment under which ``kubectl gpupool`` reaches this checkout's plugin and the test cluster."""
    kubectl_binary = shutil.which("kubectl")
    if kubectl_binary is None:
        pytest.skip("the kubectl client is not installed on this machine")
    plugin = tmp_path / "bin" / "kubectl-gpupool"
    plugin.parent.mkdir()
    plugin.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gpupool.kubectl "$@"\n')
    plugin.chmod(0o755)
    # Only the wrapper's and kubectl's own folders: an installed console script elsewhere on PATH
    # would be a second plugin of the same name, which `kubectl plugin list` reports as an error.
    path = os.pathsep.join((str(plugin.parent), str(Path(kubectl_binary).parent), "/usr/bin", "/bin"))
    return {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT), "KUBECONFIG": str(control_plane.kubeconfig)}


def run_kubectl(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S)
    assert done.returncode == 0, f"kubectl {' '.join(args)} failed: {done.stdout}{done.stderr}"
    return done.stdout


def gpu_node(make_node: MakeNode, cards: int, model: str = "Tesla-T4") -> str:
    name = f"kp-{uuid.uuid4().hex[:6]}"
    inventory = Inventory(tuple(GpuCard(i, f"GPU-{name}-{i}", model, CARD_MIB) for i in range(cards)))
    return make_node(name, annotations={NAMES.inventory: encode_inventory(inventory)})


def pod(name: str, mem_units: int, node: str = "", card: int = 0, model: str = "") -> dict[str, object]:
    """A pod asking ``mem_units`` × 256 MiB (of a card of ``model`` when given); bound to ``node``'s
    ``card`` with its assignment when given."""
    spec: dict[str, object] = {"containers": [{"name": "main", "image": "busybox", "resources": {
        "limits": {NAMES.gpu_mem: str(mem_units)}, "requests": {"cpu": "100m"}}}],
        "terminationGracePeriodSeconds": 0}
    annotations = {NAMES.gpu_models: model} if model else {}
    if node:
        spec["nodeName"] = node
        annotations |= assignment(node, card, mem_units * 256)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations}, "spec": spec}


def test_plugin_list_finds_the_plugin(kubectl: dict[str, str]) -> None:
    assert "kubectl-gpupool" in run_kubectl(kubectl, "plugin", "list")


def test_inspect_shows_the_booked_cards_and_their_holders(
        kubectl: dict[str, str], core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode) -> None:
    node = gpu_node(make_node, 2)
    core_v1.create_namespaced_pod(namespace, pod("trainer", 24, node, card=1))
    core_v1.create_namespaced_pod(namespace, pod("notebook", 8, node, card=1))
    lines = run_kubectl(kubectl, "gpupool", "inspect", node).splitlines()
    assert lines[0].split()[:3] == ["NODE", "CARD", "MODEL"]
    assert lines[1].split() == [node, "0", "Tesla-T4", "healthy", "idle", f"0/{CARD_MIB}", "0%/100%", "-", "-"]
    assert lines[2].split()[:8] == [node, "1", "Tesla-T4", "healthy", "shared", f"8192/{CARD_MIB}", "0%/100%", "-"]
    assert lines[2].endswith(f"{namespace}/notebook/main (2048MiB, 0%)")
    assert lines[3].strip() == f"{namespace}/trainer/main (6144MiB, 0%)"


def test_why_explains_a_pending_pod_that_fits_nowhere(
        kubectl: dict[str, str], core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode,
        control_plane: ControlPlane) -> None:
    model = f"T4-{uuid.uuid4().hex[:6]}"  # only this test's node has it, whatever other nodes the cluster has
    node = gpu_node(make_node, 1, model)
    core_v1.create_namespaced_pod(namespace, pod("hog", 48, node))
    core_v1.create_namespaced_pod(namespace, pod("waiting", 32, model=model))
    out = run_kubectl({**kubectl, "KUBECONFIG": ""}, "gpupool", "why", "waiting", "-n", namespace,
                      "--kubeconfig", str(control_plane.kubeconfig), "--examples", "0")
    assert f"pod {namespace}/waiting fits on none of" in out
    assert "  1 node: no single card has 8192 MiB free" in out.splitlines()[1:]
    assert f"      {node}: no single card has 8192 MiB free; largest free 4096 MiB" in out.splitlines()
