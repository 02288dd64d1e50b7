"""A real kubelet (fake container runtime) registers its node and runs a plain pod."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import StartKubelet, condition, pod_gone, pod_manifest, wait_for

pytestmark = pytest.mark.e2e


def test_kubelet_registers_a_ready_node_and_runs_a_plain_pod(
    core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet, control_plane: ControlPlane
) -> None:
    host_kubelet_dir = _listing(Path("/var/lib/kubelet"))
    node_name = f"e2e-kubelet-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(node_name, labels={"gpupool.io/e2e": "yes"})

    node = core_v1.read_node(node_name)
    assert condition(node, "Ready").status == "True"
    assert node.status.node_info.kubelet_version == control_plane.binaries.version
    assert {"type": "InternalIP", "address": kubelet.node_ip} in [
        {"type": a.type, "address": a.address} for a in node.status.addresses]
    assert node.metadata.labels["gpupool.io/e2e"] == "yes"
    assert node.metadata.labels["kubernetes.io/hostname"] == node_name
    assert kubelet.kubelet_socket.is_socket()  # device plugins register here
    assert kubelet.pod_resources_socket.is_socket()

    core_v1.create_namespaced_pod(namespace, pod_manifest(
        "plain", node_selector={"kubernetes.io/hostname": node_name}, env={"GPUPOOL_E2E": "hello"}))
    pod = wait_for(lambda: _running(core_v1, namespace, "plain"), timeout=60, what="pod Running")
    assert pod.spec.node_name == node_name
    assert pod.status.container_statuses[0].ready is True
    assert pod.status.container_statuses[0].state.running is not None

    # apiserver -> kubelet (InternalIP) -> the log file the fake runtime wrote with the env.
    log = wait_for(lambda: _log_with(core_v1, namespace, "plain", "GPUPOOL_E2E=hello"), timeout=30,
                   what="container log with the env")
    assert "GPUPOOL_E2E=hello" in log.splitlines()

    # A graceful delete completes only when the kubelet confirms the container is gone.
    core_v1.delete_namespaced_pod("plain", namespace)
    wait_for(lambda: pod_gone(core_v1, namespace, "plain"), timeout=30, what="pod deleted by kubelet")

    kubelet.stop(delete_node=True)
    assert not kubelet.directory.exists()
    assert _listing(Path("/var/lib/kubelet")) == host_kubelet_dir  # the machine's own dir untouched
    with pytest.raises(ApiException) as excinfo:
        core_v1.read_node(node_name)
    assert excinfo.value.status == 404


@pytest.mark.compat
def test_kubelet_restart_keeps_running_pods_and_recreates_the_registration_socket(
    core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet
) -> None:
    node_name = f"e2e-restart-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(node_name)
    core_v1.create_namespaced_pod(namespace, pod_manifest(
        "survivor", node_selector={"kubernetes.io/hostname": node_name}))
    before = wait_for(lambda: _running(core_v1, namespace, "survivor"), timeout=60, what="Running")
    marker = kubelet.device_plugin_dir / "stale-plugin.sock"
    with socket.socket(socket.AF_UNIX) as stale_plugin:
        stale_plugin.bind(str(marker))
    old_registration = kubelet.kubelet_socket.stat()

    kubelet.restart()

    new_registration = kubelet.kubelet_socket.stat()
    assert (new_registration.st_ino, new_registration.st_ctime_ns) != (
        old_registration.st_ino, old_registration.st_ctime_ns)
    assert not marker.exists()  # kubelet wipes the directory: plugins must register again
    after = core_v1.read_namespaced_pod("survivor", namespace)
    assert after.status.phase == "Running"
    assert after.status.container_statuses[0].restart_count == 0
    assert (after.status.container_statuses[0].container_id
            == before.status.container_statuses[0].container_id)


def _listing(path: Path) -> list[str] | None:
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else None


def _running(core_v1: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    pod = core_v1.read_namespaced_pod(name, namespace)
    return pod if pod.status.phase == "Running" else None


def _log_with(core_v1: client.CoreV1Api, namespace: str, name: str, text: str) -> str | None:
    log = str(core_v1.read_namespaced_pod_log(name, namespace))
    return log if text in log else None
