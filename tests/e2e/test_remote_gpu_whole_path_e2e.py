"""A Deployment asking for a remote share the way docs/remote-gpu.md ("Asking for one") tells a user
computes on another node's card, with every gpupool program on the path running as shipped and the
test doing nothing between creating the Deployment and reading the pod's log.

What runs (each as its own process, none called by the test):

* kube-apiserver with the shipped pod-scheduler webhook (components/scheduler-webhook/webhook.yaml,
  only its clientConfig pointed at the extender and its namespaceSelector narrowed to this test's
  namespace), and kube-controller-manager's Deployment and ReplicaSet controllers;
* ``gpupool extender`` over mutual TLS: the webhook (steering to gpupool's scheduler, injecting the
  GPU client's init container, ``LD_PRELOAD`` and the grant Secret's volume), filter and bind;
* gpupool's scheduler: kube-scheduler with the KubeSchedulerConfiguration of
  deploy/kustomize/base/scheduler-config.yaml as ``kubectl kustomize`` renders it, only the
  connection details replaced (the admin kubeconfig, the extender's URL, the client certificate
  files, the Lease's namespace); its ServiceAccount and RBAC are tested in test_own_scheduler_e2e;
* the GPU node: a Node object with one card in its inventory, tainted ``NoSchedule`` (it has no
  kubelet, so no pod may land there), and ``gpupool node-agent --remote-gpu-server`` for it, whose
  ``gpupool remote-gpu serve`` runs on the stand-in driver (a ``gpupool`` first on the agent's
  ``PATH`` adds ``--driver``). No kubelet serves that node, so the agent's device plugins are never
  registered and it publishes no inventory: the Node's inventory is written by the test, as in
  the injection e2e;
* the pod's node: a real kubelet with containerd, no GPU and no gpupool agent.

The pod runs on the host's network (``hostNetwork``: test plumbing, the server listens on loopback),
and its container runs the probe and then sleeps (a Deployment's pod restarts a container that
ends). The init container's image is the injection e2e's shell stand-in for
``gpupool remote-gpu install-client`` (tests/e2e/remote_e2e_support.py).
"""

from __future__ import annotations

import base64
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.remote_gpu import RemoteClient, decode_clients
from gpupool.api.remote_share import decode_remote_share
from gpupool.extender.http.certificates import issue_leaf
from gpupool.extender.remote_injection import INIT_CONTAINER
from gpupool.extender.scheduler_steering import GPUPOOL_SCHEDULER
from gpupool.nodeagent.remote_setup import CLIENTS_FILE
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.kubelet import Kubelet
from tests.deploy.kustomize_render import render
from tests.deploy.test_own_scheduler_deploy import scheduler_config
from tests.e2e import real_containers
from tests.e2e.e2e_support import (
    GPUPOOL_CLI,
    MakeNode,
    NodeAgentProcess,
    free_port,
    log_tail,
    pod_gone,
    wait_for,
)
from tests.e2e.remote_e2e_support import (
    CARD,
    INSTALLED,
    NAMES,
    PROBE,
    PROBE_RESULT,
    WebhookExtender,
    app_image,
    injected,
    listening,
    stand_in_gpupool,
    webhook_extender,
)
from tests.e2e.shipped_scheduler import start_shipped_scheduler, write_files
from tests.e2e.test_agent_start_checks_e2e import NotMounted
from tests.e2e.test_own_scheduler_e2e import scheduled_by

pytestmark = pytest.mark.e2e

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

MIB = 1 << 20
SHARE_MIB = 32 * 256  # gpu-mem 32: 8 GiB, the docs' example
NO_KUBELET_TAINT = {"key": "gpupool.io/e2e-no-kubelet", "effect": "NoSchedule"}
GPUS = f"model: {CARD.model}\ncards:\n  - {{uuid: {CARD.uuid}, memoryMiB: {CARD.memory_mib}}}\n"


def deployment(name: str, image: str) -> dict[str, Any]:
    """A Deployment whose pod asks for a remote share as docs/remote-gpu.md shows (the annotation,
    gpu-mem 32 and gpu-core 30), and nothing else of gpupool."""
    labels = {"app": name}
    container = {"name": "main", "image": image, "imagePullPolicy": "Never",
                 "command": ["sh", "-c", f"{PROBE} vector_add 100000 && exec sleep 3600"],
                 "env": [{"name": "GPUPOOL_REMOTE_DEADLINE_MS", "value": "20000"}],  # a loaded machine
                 "resources": {"limits": {NAMES.gpu_mem: "32", NAMES.gpu_core: "30"}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels, "annotations": {NAMES.remote_gpu: "true"}},
                                  "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                                           "containers": [container]}}}}


@contextmanager
def gpupool_scheduler(control_plane: ControlPlane, serving: WebhookExtender, namespace: str,
                      workdir: Path) -> Iterator[Path]:
    """gpupool's kube-scheduler (the kustomize base's configuration) calling ``serving``'s extender
    with a client certificate of its CA, its Lease in ``namespace``; yields its log."""
    leaf = issue_leaf(serving.ca, "kube-scheduler", server=False)
    client_dir = write_files(workdir / "scheduler-client", {"client.crt": leaf.cert_pem, "client.key": leaf.key_pem,
                                                            "ca.crt": serving.ca.cert_pem})
    process, log = start_shipped_scheduler(control_plane.binaries.kube_scheduler, scheduler_config(render("base")),
                                           kubeconfig=control_plane.kubeconfig, workdir=workdir,
                                           extender_url=serving.extender.url, client_dir=client_dir,
                                           what="gpupool's kube-scheduler", lease_namespace=namespace)
    try:
        yield log
    finally:
        process.stop()


@contextmanager
def gpu_node_agent(control_plane: ControlPlane, node: str, port: int, workdir: Path) -> Iterator[NodeAgentProcess]:
    """``gpupool node-agent --remote-gpu-server 127.0.0.1:PORT`` for ``node`` (no kubelet: an empty
    device plugin directory, no PodResources socket), its server on the stand-in driver."""
    kubelet_dirs = workdir / "no-kubelet"
    (kubelet_dirs / "device-plugins").mkdir(parents=True)
    paths = NotMounted(node, kubelet_dirs / "device-plugins", kubelet_dirs / "pod-resources" / "kubelet.sock")
    agent = NodeAgentProcess(paths, control_plane.kubeconfig, GPUS, workdir,  # type: ignore[arg-type]
                             ("--no-usage-monitor", "--state-dir", str(workdir / "state"),
                              "--remote-gpu-server", f"127.0.0.1:{port}"))
    agent.cli = ["env", f"PATH={stand_in_gpupool(workdir / 'bin')}:{os.environ['PATH']}", *GPUPOOL_CLI]
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


@contextmanager
def workload_controllers(control_plane: ControlPlane) -> Iterator[None]:
    control_plane.start_controllers()
    try:
        yield
    finally:
        control_plane.stop_controllers()


def test_a_deployment_asking_for_a_remote_share_computes_through_gpupools_programs_alone(
        control_plane: ControlPlane, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api, namespace: str,
        make_node: MakeNode, containerd_kubelet: Kubelet, tmp_path: Path) -> None:
    apps = client.AppsV1Api(kube_api_client)
    cpu = containerd_kubelet.node_name
    image = app_image(containerd_kubelet, tmp_path)
    gpu = make_node(name=f"e2e-gpu-{uuid.uuid4().hex[:6]}",
                    annotations={NAMES.inventory: encode_inventory(Inventory((CARD,)))})
    core_v1.patch_node(gpu, {"spec": {"taints": [NO_KUBELET_TAINT]}})
    port = free_port()
    name = f"trainer-{uuid.uuid4().hex[:4]}"
    body = deployment(name, image)
    template = body["spec"]["template"]
    probe_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "generateName": f"{name}-"},
                 "spec": template["spec"]}
    with (webhook_extender(control_plane, kube_api_client, namespace, containerd_kubelet, tmp_path) as serving,
          gpupool_scheduler(control_plane, serving, namespace, tmp_path) as scheduler_log,
          gpu_node_agent(control_plane, gpu, port, tmp_path / "gpu-node") as agent,
          workload_controllers(control_plane)):
        extender = serving.extender
        state = tmp_path / "gpu-node" / "state"

        def explain() -> str:
            pods: list[Any] = core_v1.list_namespaced_pod(namespace).items
            return "\n".join([*(f"pod {p.metadata.name}: node {p.spec.node_name}, {p.status.phase}, "
                                f"{p.status.container_statuses or p.status.init_container_statuses}" for p in pods),
                              f"--- scheduler\n{log_tail(scheduler_log)}",
                              f"--- extender\n{_without_crd_retries(log_tail(extender.log_path, 20000))[-3000:]}",
                              f"--- GPU node's agent\n{agent.log()}"])

        # the cluster is ready for the user: the webhook answers (the apiserver's informer takes a
        # moment) and the GPU node's server listens
        wait_for(lambda: injected(core_v1.create_namespaced_pod(namespace, probe_pod, dry_run="All")), timeout=60,
                 what="the webhook to inject a dry-run pod", explain=explain)
        wait_for(lambda: _serving(agent, port), timeout=120, what="the GPU node's server to listen", explain=explain)

        began = time.monotonic()
        apps.create_namespaced_deployment(namespace, body)  # what the user does; the rest is the programs'
        pod = wait_for(lambda: _computed(core_v1, namespace, name), timeout=300,
                       what="the Deployment's pod to print the probe's result", explain=explain)
        took = time.monotonic() - began
        pod_name, uid = str(pod.metadata.name), str(pod.metadata.uid)

        assert pod.metadata.owner_references[0].kind == "ReplicaSet"
        assert (pod.spec.scheduler_name, pod.spec.node_name) == (GPUPOOL_SCHEDULER, cpu)
        assert wait_for(lambda: scheduled_by(core_v1, namespace, pod_name), timeout=30,
                        what="the pod's Scheduled event") == GPUPOOL_SCHEDULER
        notes = pod.metadata.annotations
        assert NAMES.assignment not in notes
        share = decode_remote_share(notes[NAMES.remote_share])
        assert (share.server, share.card.uuid, share.card.memory_mib, share.pod_uid) == (gpu, CARD.uuid, SHARE_MIB,
                                                                                           uid)
        assert str(core_v1.read_namespaced_pod_log(pod_name, namespace, container=INIT_CONTAINER)).strip() == INSTALLED

        [entry] = _clients(state) or []
        assert (entry.pod, entry.card_uuid, entry.memory_mib, entry.compute_percent) == (
            f"{namespace}/{pod_name}", CARD.uuid, SHARE_MIB, 30)
        secret: Any = core_v1.read_namespaced_secret(f"{pod_name}-gpupool-remote", namespace)
        assert {k: base64.b64decode(v).decode() for k, v in secret.data.items()} == {
            "remote_endpoint": f"127.0.0.1:{port}", "remote_token": entry.token}
        [owner] = secret.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid) == ("Pod", pod_name, uid)
        assert _remote_clients(agent) == 1
        assert extender.metric("gpupool_cluster_gpu_memory_allocated_bytes") == SHARE_MIB * MIB

        apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": 0}})
        wait_for(lambda: pod_gone(core_v1, namespace, pod_name), timeout=120, what="the pod deleted after scale 0",
                 explain=explain)
        wait_for(lambda: _clients(state) == [], timeout=30, what="the agent to drop the client", explain=explain)
        wait_for(lambda: _remote_clients(agent) == 0, timeout=30, what="the agent's metrics without the client")
        wait_for(lambda: extender.metric("gpupool_cluster_gpu_memory_allocated_bytes") == 0, timeout=30,
                 what="the extender's ledger to release the share", explain=explain)
        assert agent.running(), agent.log()
    print(f"\nDeployment created to the probe's result on the remote card: {took:.1f} s")


def _computed(core_v1: client.CoreV1Api, namespace: str, app: str) -> Any:
    """The Deployment's pod once its main container printed the probe's result; None before."""
    pods: list[Any] = core_v1.list_namespaced_pod(namespace, label_selector=f"app={app}").items
    for pod in pods:
        try:
            log = str(core_v1.read_namespaced_pod_log(str(pod.metadata.name), namespace, container="main"))
        except ApiException:  # not started yet
            continue
        if PROBE_RESULT in log:
            return pod
        assert "vector_add" not in log, log  # the probe ran and printed something else: fail now
    return None


def _serving(agent: NodeAgentProcess, port: int) -> bool:
    """Whether the agent's server listens; fails at once when the agent stopped."""
    assert agent.running(), f"the GPU node's agent stopped:\n{agent.log()}"
    return listening(port)


def _without_crd_retries(log: str) -> str:
    """An extender log without its retries of CRDs this control plane does not have (quotas, groups)."""
    return "\n".join(line for line in log.splitlines() if "list/watch failed: 404" not in line)


def _clients(state: Path) -> list[RemoteClient] | None:
    """The GPU server's clients as the agent wrote them (None: no file yet)."""
    path = state / CLIENTS_FILE
    return decode_clients(path.read_text()) if path.exists() else None


def _remote_clients(agent: NodeAgentProcess) -> float:
    """The agent's ``gpupool_card_remote_clients``, all cards together."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in agent.metrics().splitlines()
               if line.startswith("gpupool_card_remote_clients{"))
