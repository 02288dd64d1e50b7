"""GPU pods under plain runc: the node agent's Allocate hands out the driver's libraries.

The kubelet runs containers through containerd and plain runc (no NVIDIA container runtime, hook or
CDI). The image holds only the library tests' probe, dynamically linked against ``libcuda.so.1``,
and no driver. ``gpupool node-agent --driver-libraries DIR`` names the stand-in driver's directory
(``libcuda.so.1``, ``libnvidia-ml.so.1``, built by ``gpupool/shim/build.py``), as an admin would name
the host's. What it proves: the pod, which names no library and sets no ``LD_LIBRARY_PATH``, starts
the probe, which loads the driver from the directory the grant mounted and reads its card; and the
probe started without those mounts cannot load at all (the loader finds no ``libcuda.so.1``).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.names import ResourceNames
from gpupool.nodeagent.driver_libraries import CONTAINER_DIR
from gpupool.shim.build import RELEASE, ShimBuildError, find_compiler
from gpupool.testenv.images import build_image
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.e2e_support import ExtenderProcess, NodeAgentProcess, wait_for
from tests.e2e.real_containers import stand_in_cards
from tests.shim.toolchain import build_toolchain, parse_steps

pytestmark = pytest.mark.e2e

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

NAMES = ResourceNames()
CARD_MIB = 16384
PROBE = "/usr/local/bin/probe"
COMMAND = f'echo "path=$LD_LIBRARY_PATH"; ls {CONTAINER_DIR}; exec {PROBE} symbol total'


def pod_manifest(name: str, node: str, image: str) -> dict[str, Any]:
    container = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["sh", "-c", COMMAND],
                 "env": [{"name": "GPUPOOL_STANDIN_STATE", "value": "/work/standin.state"},
                         {"name": "GPUPOOL_STANDIN_MEMORY_MIB", "value": str(CARD_MIB)}],
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}],
                 "resources": {"limits": {NAMES.gpu_mem: "16"}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "volumes": [{"name": "work", "emptyDir": {}}],
                     "nodeSelector": {"kubernetes.io/hostname": node}}}


def finished(core_v1: client.CoreV1Api, namespace: str, name: str) -> tuple[str, str] | None:
    pod = core_v1.read_namespaced_pod(name, namespace)
    if pod.status.phase not in ("Succeeded", "Failed"):
        return None
    return str(pod.status.phase), str(core_v1.read_namespaced_pod_log(name, namespace, container="main"))


def test_a_gpu_pod_runs_under_plain_runc_with_the_driver_the_grant_mounts(
    core_v1: client.CoreV1Api, namespace: str, containerd_kubelet: Kubelet, tmp_path: Path,
    start_node_agent: Callable[..., NodeAgentProcess], gpupool_extender: ExtenderProcess,
) -> None:
    try:
        find_compiler()
    except ShimBuildError as exc:
        pytest.skip(f"cannot build the stand-in driver here: {exc}")
    tc = build_toolchain(RELEASE, tmp_path)
    image = build_image("plain-runc-driver", {PROBE: tc.probe})  # no libcuda.so.1 in the image
    containerd_kubelet.import_image(image)
    node = containerd_kubelet.node_name
    cards = stand_in_cards(tmp_path / "dev", memory_mib=CARD_MIB)

    agent = start_node_agent(containerd_kubelet, cards, ("--driver-libraries", str(tc.standin)))
    wait_for(lambda: (core_v1.read_node(node).status.allocatable or {}).get(NAMES.gpu_mem) == str(2 * CARD_MIB // 256),
             timeout=60, what=f"gpupool devices on {node}\n{agent.log()}")
    began = time.monotonic()
    core_v1.create_namespaced_pod(namespace, pod_manifest("with-driver", node, image.ref))
    phase, log = wait_for(lambda: finished(core_v1, namespace, "with-driver"), timeout=90,
                          what=f"the probe run\n{agent.log()}")
    print(f"\n  pod create to the probe's end: {time.monotonic() - began:.1f} s")
    assert phase == "Succeeded", log
    assert f"path={CONTAINER_DIR}" in log
    assert "libcuda.so.1" in log and "libnvidia-ml.so.1" in log
    [total] = parse_steps(log)
    assert (total.text, total.code, int(total.values[0])) == ("total", 0, CARD_MIB << 20), log

    # Without the mounts the probe cannot start at all: the loader finds no libcuda.so.1 (the host
    # has no driver either, as the image has none).
    bare = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    alone = subprocess.run([str(tc.probe), "symbol", "total"], env=bare, capture_output=True, text=True, timeout=30)
    assert alone.returncode != 0 and "libcuda.so.1" in alone.stderr, (alone.returncode, alone.stderr)
