"""A pod in a real container on a node without a GPU driver computes on another machine's card.

The pod's image holds no driver: its ``libcuda.so.1`` is gpupool's GPU client (what
``gpupool remote-gpu client-path`` builds), and the CUDA driver API program (bench/remote_probe.c)
runs a vector add and a scale whose results it reads back and checks. ``gpupool remote-gpu serve``
runs on the host with the stand-in driver (the GPU node). The pod uses the host's network
(``hostNetwork``) to reach the server on loopback; the endpoint and token come from its environment
(the grant-file keys are tested in tests/remote). Scheduling and the node agent's side (the
clients file, the token Secret) are tested with the control plane's own tests.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.shim.build import ShimBuildError, build_standin, find_compiler
from gpupool.shim.remote_build import build_client
from gpupool.testenv.images import LIB_DIR, build_image
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.e2e_support import wait_for
from tests.remote.remote_support import PROBE_SOURCE, Programs, running_server, token
from tests.remote.remote_support import client as remote_client

pytestmark = pytest.mark.e2e

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

PROBE = "/usr/local/bin/remote_probe"


def pod_manifest(node: str, image: str, endpoint: str) -> dict[str, Any]:
    container = {"name": "main", "image": image, "imagePullPolicy": "Never",
                 "command": [PROBE, "vector_add", "100000"],
                 "env": [{"name": "GPUPOOL_REMOTE_ENDPOINT", "value": endpoint},
                         {"name": "GPUPOOL_REMOTE_TOKEN", "value": token("a")},
                         {"name": "GPUPOOL_REMOTE_DEADLINE_MS", "value": "20000"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "remote-gpu"},
            "spec": {"containers": [container], "restartPolicy": "Never", "hostNetwork": True,
                     "terminationGracePeriodSeconds": 1, "nodeSelector": {"kubernetes.io/hostname": node}}}


def test_a_pod_without_a_driver_computes_on_a_remote_card(core_v1: client.CoreV1Api, namespace: str,
                                                           containerd_kubelet: Kubelet, tmp_path: Path) -> None:
    try:
        compiler = find_compiler()
    except ShimBuildError as exc:
        pytest.skip(f"cannot build the GPU client here: {exc}")
    client_dir = build_client()
    probe = tmp_path / "remote_probe"
    subprocess.run([*compiler, "-O1", "-o", str(probe), str(PROBE_SOURCE), f"-L{client_dir}", "-lcuda"],
                   check=True, timeout=120)
    image = build_image("remote-gpu-e2e", {f"{LIB_DIR}/libcuda.so.1": client_dir / "libcuda.so.1", PROBE: probe})
    containerd_kubelet.import_image(image)
    programs = Programs(build_standin(), client_dir, probe)
    with running_server(programs, tmp_path, [remote_client("a")]) as server:
        core_v1.create_namespaced_pod(namespace, pod_manifest(containerd_kubelet.node_name, image.ref,
                                                              f"127.0.0.1:{server.port}"))

        def finished() -> str | None:
            status = core_v1.read_namespaced_pod("remote-gpu", namespace).status
            phase = str(status.phase) if status is not None else ""
            return phase if phase in ("Succeeded", "Failed") else None

        phase = wait_for(finished, timeout=120, what="the remote GPU pod to finish")
        log = str(core_v1.read_namespaced_pod_log("remote-gpu", namespace, container="main"))
        served = "".join(server.log)
    assert (phase, log.strip()) == ("Succeeded", "ok vector_add 100000 c[99999]=149998"), (phase, log, served)
