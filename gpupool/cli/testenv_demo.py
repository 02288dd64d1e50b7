"""``gpupool testenv up --demo``: gpupool running on the test cluster, and a GPU pod to apply.

What a cluster install runs, on this machine, so a new user sees a pod get its share of a card in
a few minutes without GPUs or a cluster: ``gpupool extender``, gpupool's own scheduler (the test
environment's kube-scheduler with one profile, ``gpupool-scheduler``, calling the extender, as
deploy/kustomize/base/scheduler-config.yaml configures it) and ``gpupool node-agent`` with fake GPUs
on a real kubelet (fake container runtime: containers print their environment and sleep).

Differences from a cluster install, on purpose: the extender speaks plain HTTP on loopback (no
certificates to make), and the pod names ``schedulerName: gpupool-scheduler`` itself where a
cluster's mutating webhook would set it. The processes are recorded in the test environment's
state file, so ``gpupool testenv down`` stops them with the cluster.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpupool.api.agent_lease import DEFAULT_LEASE_NAMESPACE
from gpupool.api.names import ResourceNames
from gpupool.extender.scheduler_steering import GPUPOOL_SCHEDULER
from gpupool.nodeagent.metrics import DEFAULT_METRICS_PORT
from gpupool.testenv.config import ExtenderConfig
from gpupool.testenv.controlplane import ControlPlane, scheduler_args
from gpupool.testenv.errors import StartupError
from gpupool.testenv.kubelet import Kubelet
from gpupool.testenv.ports import free_ports
from gpupool.testenv.probe import is_ok
from gpupool.testenv.procs import ManagedProcess, spawn, wait_until

#: The namespace the demo's components keep their Leases in, as a cluster install does.
SYSTEM_NAMESPACE = "gpupool-system"
DEMO_NODE = "gpu-node-1"
DEMO_POD = "gpu-demo"
CARD_MIB = 16_384
CARDS = 2
FAKE_GPUS = {
    "model": "Tesla-T4",
    "cards": [{"uuid": f"GPU-demo-{i:04d}", "memoryMiB": CARD_MIB} for i in range(CARDS)],
    "topology": [list(range(CARDS))],
}
#: The ``gpupool`` command line of the running interpreter (what ``pip install .`` installed, or the
#: checkout on ``PYTHONPATH``), so the demo runs the same gpupool as the command that started it.
GPUPOOL_CLI = [sys.executable, "-c", "from gpupool.cli.main import main; main()"]

Log = Callable[[str], None]
NAMES = ResourceNames()
MAX_SOCKET_PATH = 107
"""The longest path a Unix socket address holds (``sun_path`` is 108 bytes with its terminator)."""
SOCKET_ROOM = "gpupool-tencent-vcuda-memory.sock"
"""As long as the longest socket name the node agent creates in the plugin directory, or longer."""


@dataclass(frozen=True)
class Demo:
    """What ``--demo`` started: the processes (for the state file) and the pod manifest it wrote."""

    processes: tuple[ManagedProcess, ...]
    pod_path: Path
    extender_url: str


def demo_pod(names: ResourceNames = NAMES) -> dict[str, Any]:
    """A pod asking for a slice of one card: 4 GiB (16 units of 256 MiB) and 30 % of its compute."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": DEMO_POD},
        "spec": {
            "schedulerName": GPUPOOL_SCHEDULER,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"],
                "resources": {"limits": {names.gpu_mem: "16", names.gpu_core: "30"}},
            }],
        },
    }


def scheduler_config(kubeconfig: Path, extender_url: str, names: ResourceNames = NAMES) -> dict[str, Any]:
    """gpupool's scheduler: one profile calling the extender for filter, bind and preempt (the
    stanza of deploy/scheduler-config-v1.yaml, over plain HTTP), with its own Lease."""
    extender = ExtenderConfig(url_prefix=extender_url, prioritize_verb=None, bind_verb="bind",
                              preempt_verb="preempt", node_cache_capable=True,
                              managed_resources=names.managed(), http_timeout_s=10.0)
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": True, "resourceLock": "leases",
                           "resourceNamespace": SYSTEM_NAMESPACE, "resourceName": GPUPOOL_SCHEDULER},
        "percentageOfNodesToScore": 100,
        "profiles": [{"schedulerName": GPUPOOL_SCHEDULER}],
        "extenders": [extender.to_v1()],
    }


def start_demo(plane: ControlPlane, kubelet: Kubelet, directory: Path, *, log: Log,
               started: list[ManagedProcess], timeout: float = 90.0) -> Demo:
    """Start the extender, gpupool's scheduler and the node agent for ``kubelet``; return once the
    node advertises gpupool's resources. Every process started is appended to ``started`` at
    once, so a caller can stop them when a later step fails."""
    from kubernetes import client

    from gpupool.kube.client_config import api_configuration

    longest = kubelet.device_plugin_dir / SOCKET_ROOM
    if len(str(longest)) > MAX_SOCKET_PATH:
        raise StartupError(f"the state directory's path is too long for the device plugins' Unix sockets "
                           f"({len(str(longest))} > {MAX_SOCKET_PATH} characters): use a shorter --state-dir")
    directory.mkdir(parents=True, exist_ok=True)
    api_client = client.ApiClient(api_configuration(str(plane.kubeconfig)))
    try:
        core_v1 = client.CoreV1Api(api_client)
        for namespace in (SYSTEM_NAMESPACE, DEFAULT_LEASE_NAMESPACE):
            core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        extender_port, scheduler_port, metrics_port = free_ports(3)
        if _port_free(DEFAULT_METRICS_PORT):  # where `kubectl gpupool inspect` reads usage through the node proxy
            metrics_port = DEFAULT_METRICS_PORT
        extender_url = f"http://127.0.0.1:{extender_port}"
        extender = spawn("gpupool-extender", [
            *GPUPOOL_CLI, "extender", "--host", "127.0.0.1", "--port", str(extender_port),
            "--kubeconfig", str(plane.kubeconfig), "--leader-elect-resource-namespace", SYSTEM_NAMESPACE,
            "--identity", "demo-extender"], directory / "extender.log", executable=Path(sys.executable))
        started.append(extender)
        wait_until(lambda: is_ok(f"{extender_url}/readyz"), what="gpupool extender ready", timeout=timeout,
                   watch=[extender])
        log(f"gpupool extender ready at {extender_url}")

        config_path = directory / "gpupool-scheduler.yaml"
        config_path.write_text(yaml.safe_dump(scheduler_config(plane.kubeconfig, extender_url), sort_keys=False))
        scheduler = spawn(GPUPOOL_SCHEDULER, [
            plane.binaries.kube_scheduler,
            *scheduler_args(config=config_path, kubeconfig=plane.kubeconfig, port=scheduler_port)],
            directory / "gpupool-scheduler.log")
        started.append(scheduler)
        wait_until(lambda: _lease_held(client.CoordinationV1Api(api_client)), what="gpupool-scheduler's Lease",
                   timeout=timeout, watch=[scheduler])
        log(f"{GPUPOOL_SCHEDULER} (kube-scheduler {plane.binaries.version}) leads")

        gpus = directory / "fake-gpus.yaml"
        gpus.write_text(yaml.safe_dump(FAKE_GPUS, sort_keys=False))
        agent = spawn("gpupool-node-agent", [
            *GPUPOOL_CLI, "node-agent", "--node-name", kubelet.node_name, "--fake-gpus", str(gpus),
            "--plugin-dir", str(kubelet.device_plugin_dir),
            "--pod-resources-socket", str(kubelet.pod_resources_socket),
            "--kubeconfig", str(plane.kubeconfig), "--metrics-port", str(metrics_port),
            "--isolation", "none",  # fake cards: nothing to enforce on, said explicitly
            "--state-dir", str(directory / "agent-state"),
            "--usage-state-file", str(directory / "usage-state.json")],
            directory / "node-agent.log", executable=Path(sys.executable))
        started.append(agent)
        wait_until(lambda: _advertises(core_v1, kubelet.node_name), timeout=timeout, watch=[agent],
                   what=f"{kubelet.node_name} to advertise gpupool's resources")
        log(f"node {kubelet.node_name}: {CARDS} fake {FAKE_GPUS['model']} cards of {CARD_MIB // 1024} GiB "
            f"served by gpupool node-agent")
    finally:
        api_client.close()  # type: ignore[no-untyped-call]
    pod_path = directory / "gpu-pod.yaml"
    pod_path.write_text(yaml.safe_dump(demo_pod(), sort_keys=False))
    return Demo(tuple(started), pod_path, extender_url)


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _lease_held(leases: Any) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        lease = leases.read_namespaced_lease(GPUPOOL_SCHEDULER, SYSTEM_NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return bool(lease.spec.holder_identity)


def _advertises(core_v1: Any, node_name: str, names: ResourceNames = NAMES) -> bool:
    """Whether kubelet lists the agent's memory devices and the agent published its inventory."""
    node = core_v1.read_node(node_name)
    allocatable = node.status.allocatable or {}
    return (allocatable.get(names.gpu_mem) == str(CARDS * CARD_MIB // 256)
            and names.inventory in (node.metadata.annotations or {}))


def guide(demo: Demo, plane: ControlPlane, state_dir: Path, state_option: str = "") -> str:
    """What to type next, and the pod, for stdout; ``state_option`` is the ``--state-dir`` the
    other testenv commands need when the state is not in the default place."""
    kubectl = plane.binaries.kubectl
    pod_text = demo.pod_path.read_text()
    return "\n".join([
        f"gpupool demo is up (Kubernetes {plane.binaries.version}, state in {state_dir}). Next:",
        "",
        f'  eval "$(gpupool testenv env{state_option})"              # KUBECONFIG for this cluster',
        f"  alias kubectl={kubectl}   # the kubectl built with it (any kubectl works)",
        f"  kubectl apply -f {demo.pod_path}",
        f"  kubectl get pod {DEMO_POD} -o wide            # Running on {DEMO_NODE}",
        f"  kubectl logs {DEMO_POD} | grep ^GPUPOOL_      # the share it was granted (fake runtime: env)",
        "  kubectl gpupool inspect                      # cards, what is booked, by which pod",
        f"  gpupool testenv down{state_option}                         # stop everything",
        "",
        f"--- {demo.pod_path}",
        pod_text.rstrip(),
    ])

