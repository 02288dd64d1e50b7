"""``kubectl gpupool`` run by the real ``kubectl`` client against the real kube-apiserver.

kubectl finds plugins as executables named ``kubectl-<name>`` on ``PATH``. Installed, that is the
``kubectl-gpupool`` console script of the package; here, where the package is imported from the
checkout, a two-line wrapper of the same name runs ``python -m gpupool.kubectl`` (the same entry
point) with this checkout on ``PYTHONPATH``. Nodes are kubelet-less API objects with an
``inventory-v1`` annotation; pods are bound by hand with their ``assignment-v1``, as a bind leaves them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes import client

from gpupool.api.agent_lease import LEASE_COMPONENT, LEASE_LABEL, lease_name
from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.api.tenancy import TenancyNames
from gpupool.core.model import GpuCard
from gpupool.nodeagent.metrics import metrics_app
from gpupool.nodeagent.monitor.service import UsageMonitor
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.nodeip import find_node_ip
from tests.e2e.e2e_support import MakeNode, free_port
from tests.e2e.test_tenancy_e2e import crds
from tests.kubectl.objects import assignment
from tests.nodeagent.usage_world import agent_with_monitor

# Also in the compatibility set run on the oldest supported Kubernetes minor (scripts/test-all).
pytestmark = [pytest.mark.e2e, pytest.mark.compat]

__all__ = ["crds"]  # deploy/crds/ installed, as a fixture of this module too

NAMES = ResourceNames()
NAMES_TENANCY = TenancyNames()
ROOT = Path(__file__).resolve().parents[2]
CARD_MIB = 16384
KUBECTL_TIMEOUT_S = 60


@pytest.fixture
def kubectl(tmp_path: Path, control_plane: ControlPlane) -> dict[str, str]:
    """The environment under which ``kubectl gpupool`` reaches this checkout's plugin and the test
    cluster, with the kubectl of the release under test (built by the test environment)."""
    kubectl_binary = control_plane.binaries.kubectl
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


def gpu_node(make_node: MakeNode, cards: int, model: str = "Tesla-T4", uuids: tuple[str, ...] = (),
             labels: dict[str, str] | None = None) -> str:
    name = f"kp-{uuid.uuid4().hex[:6]}"
    inventory = Inventory(tuple(GpuCard(i, uuids[i] if uuids else f"GPU-{name}-{i}", model, CARD_MIB)
                                for i in range(cards)))
    return make_node(name, annotations={NAMES.inventory: encode_inventory(inventory)}, labels=labels)


def set_internal_ip(core_v1: client.CoreV1Api, node: str, address: str) -> None:
    core_v1.patch_node_status(node, {"status": {"addresses": [{"type": "InternalIP", "address": address}]}})


@pytest.fixture
def serve_agent(tmp_path: Path) -> Iterator[Callable[[str], tuple[str, int]]]:
    """``serve_agent(node)`` runs the agent HTTP server of ``node`` (scripted monitor: pid 100 on card
    GPU-0 at 50 %, 3500 MiB used) on this machine's node address and a free port, on a loop of its
    own thread; stopped after the test."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    started: list[tuple[web.AppRunner, UsageMonitor]] = []

    async def start(node: str, host: str, port: int) -> None:
        agent, monitor, _ = agent_with_monitor(tmp_path, node)
        started.append((web.AppRunner(metrics_app(agent)), monitor))
        await agent.pre_start("", [])
        await monitor.step()
        await started[-1][0].setup()
        await web.TCPSite(started[-1][0], host, port).start()

    def serve(node: str) -> tuple[str, int]:
        host, port = find_node_ip(), free_port()
        asyncio.run_coroutine_threadsafe(start(node, host, port), loop).result(30)
        return host, port

    yield serve
    for runner, monitor in started:
        monitor.stop()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


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


def agent_lease(node: str, renewed: dt.datetime) -> dict[str, object]:
    """The node agent's heartbeat Lease for ``node``, last renewed at ``renewed``."""
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": lease_name(node), "labels": {LEASE_LABEL: LEASE_COMPONENT}},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40,
                     "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}


@pytest.mark.usefixtures("crds")
def test_why_applies_the_quotas_pools_and_the_agents_leases(
        kubectl: dict[str, str], core_v1: client.CoreV1Api, kube_api_client: client.ApiClient, namespace: str,
        make_node: MakeNode) -> None:
    """The extender's rules beyond card fit, read from the real API: a GpuQuota allowing pool a only,
    and a node of that pool whose agent stopped renewing its Lease."""
    model = f"T4-{uuid.uuid4().hex[:6]}"
    pool = NAMES_TENANCY.pool_label
    fitting = gpu_node(make_node, 1, model, labels={pool: "a"})
    outside = gpu_node(make_node, 1, model, labels={pool: "b"})
    silent = gpu_node(make_node, 1, model, labels={pool: "a"})
    client.CustomObjectsApi(kube_api_client).create_namespaced_custom_object(
        "gpupool.io", "v1alpha1", namespace, "gpuquotas",
        {"apiVersion": "gpupool.io/v1alpha1", "kind": "GpuQuota", "metadata": {"name": "gpus"},
         "spec": {"hard": {"gpuMemory": "64Gi"}, "pools": ["a"]}})
    leases = client.CoordinationV1Api(kube_api_client)
    now = dt.datetime.now(dt.UTC)
    leases.create_namespaced_lease(namespace, agent_lease(fitting, now))
    leases.create_namespaced_lease(namespace, agent_lease(silent, now - dt.timedelta(minutes=10)))
    core_v1.create_namespaced_pod(namespace, pod("waiting", 4, model=model))
    out = run_kubectl(kubectl, "gpupool", "why", "waiting", "-n", namespace, "--examples", "0",
                      "--agent-lease-namespace", namespace, "--best", "1")
    lines = out.splitlines()
    assert lines[1].split() == [fitting, "(score", lines[1].split()[-1]], out
    assert (f"      {outside}: node is not in a pool GpuQuota {namespace}/gpus allows (a; node label {pool})"
            in lines), out
    assert any(line.startswith(f"      {silent}: node agent on {silent} last renewed 6") for line in lines), out
    assert "note:" not in out


UNREACHABLE_IP = "198.51.100.7"
"""TEST-NET-2: no agent answers there."""


def test_inspect_reads_usage_from_each_agent_through_the_node_proxy(
        kubectl: dict[str, str], core_v1: client.CoreV1Api, make_node: MakeNode,
        serve_agent: Callable[[str], tuple[str, int]]) -> None:
    node = gpu_node(make_node, 2, uuids=("GPU-0", "GPU-1"))
    host, port = serve_agent(node)
    set_internal_ip(core_v1, node, host)
    away = gpu_node(make_node, 1)
    set_internal_ip(core_v1, away, UNREACHABLE_IP)
    lines = run_kubectl(kubectl, "gpupool", "inspect", "--agent-port", str(port), "--agent-timeout", "2",
                        ).splitlines()
    rows = {(line.split()[0], line.split()[1]): line.split() for line in lines[1:] if line.startswith("kp-")}
    assert rows[(node, "0")][7:9] == ["50%", "3500MiB"]
    assert rows[(node, "1")][7:9] == ["0%", "0MiB"]
    assert rows[(away, "0")][7] == "-"
    note = next(line for line in lines if line.startswith(f"node {away}: "))
    assert note.startswith(f"node {away}: usage not read from the node agent (port {port}): "), note
