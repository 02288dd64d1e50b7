"""The usage monitor sees real processes in real containers open their granted GPU device.

Everything runs for real: kube-scheduler calls ``gpupool extender``, a real kubelet (v1.37.2) runs
the pod through containerd and runc (``start_kubelet(..., runtime="containerd")``), the pod's image
is the test environment's locally built busybox, and ``gpupool node-agent --fake-gpus`` serves the
device plugins and runs its usage monitor. Only the GPUs are stand-ins: each card's device file
is a character device node made by the test (``/dev/random`` and ``/dev/urandom``'s numbers, so
opening it works) under a ``devicePathPrefix`` that the host and the node see alike, and the
control devices Allocate also hands out (``/dev/nvidiactl`` ...) exist only in the node's ``/dev``.

What it proves: Allocate's device specs and env reach the container (the container opens the
card its ``GPUPOOL_CARD_INDICES`` names, and ``/proc/<pid>/environ`` holds exactly its grant); the
state file lists that card held by that process under its own namespace, pod, container and
container ID, which is the ``containerID`` of the pod's status and the ``/k8s.io/<id>`` of the
process's cgroup; and the card goes free when the pod is deleted. A second test runs a dynamically
linked program with a preloaded library in the dynamic image (the image API other tests build on),
and its container keeps running across a kubelet restart.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.annotations import decode_assignment
from gpupool.api.names import ResourceNames
from gpupool.testenv.images import LIB_DIR, build_image
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.e2e_support import GRANT_KEYS, ExtenderProcess, NodeAgentProcess, expected_grant, wait_for
from tests.e2e.real_containers import stand_in_cards

pytestmark = pytest.mark.e2e

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

NAMES = ResourceNames()
CARD_MIB = 16384
#: Reads the card named by the grant's env and keeps it open as the container's only process.
OPEN_CARD = 'exec 3<"${CARD_PREFIX}${GPUPOOL_CARD_INDICES}"; exec sleep 3600'


def pod_manifest(name: str, node: str, image: str, containers: dict[str, dict[str, str]],
                 command: str, env: dict[str, str]) -> dict[str, Any]:
    """A pod of busybox containers running ``command`` under ``sh -c``, each with its limits."""
    specs = [{"name": cname, "image": image, "imagePullPolicy": "Never", "command": ["sh", "-c", command],
              "env": [{"name": k, "value": v} for k, v in env.items()],
              **({"resources": {"limits": limits}} if limits else {})}
             for cname, limits in containers.items()]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": specs, "terminationGracePeriodSeconds": 1,
                     "nodeSelector": {"kubernetes.io/hostname": node}}}


def running(core_v1: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    pod = core_v1.read_namespaced_pod(name, namespace)
    assert pod.status.phase not in ("Failed", "Succeeded"), (pod.status.phase, pod.status.container_statuses)
    return pod if pod.status.phase == "Running" else None


def device_holders(state_file: Path) -> dict[str, list[dict[str, Any]]]:
    """Device path → holders, from the monitor's state file (schema v1, docs/monitor.md)."""
    if not state_file.exists():
        return {}
    state = json.loads(state_file.read_text())
    assert state["schema"] == "gpupool.io/usage-state" and state["version"] == 1, state
    return {d["path"]: d["holders"] for d in state["devices"]}


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


def test_usage_monitor_records_a_real_containers_open_of_its_granted_card(
    core_v1: client.CoreV1Api, namespace: str, containerd_kubelet: Kubelet, tmp_path: Path,
    start_node_agent: Callable[..., NodeAgentProcess], gpupool_extender: ExtenderProcess,
) -> None:
    kubelet = containerd_kubelet
    node = kubelet.node_name
    prefix = f"{tmp_path / 'dev'}/nvidia"
    agent = start_node_agent(kubelet, stand_in_cards(tmp_path / "dev"))
    wait_for(lambda: (core_v1.read_node(node).status.allocatable or {}).get(NAMES.gpu_mem) == str(2 * CARD_MIB // 256),
             timeout=60, what=f"gpupool devices on {node}\n{agent.log()}")
    limits = {NAMES.gpu_mem: "16", NAMES.gpu_core: "30"}
    containers = {"train": limits, "eval": limits}
    created = time.monotonic()
    core_v1.create_namespaced_pod(namespace, pod_manifest("job", node, kubelet.images.busybox.ref, containers,
                                                          OPEN_CARD, {"CARD_PREFIX": prefix}))
    pod = wait_for(lambda: running(core_v1, namespace, "job"), timeout=90, what=f"job Running\n{agent.log()}")
    print(f"  GPU pod on containerd: create to Running {time.monotonic() - created:.1f} s")
    assignment = decode_assignment(pod.metadata.annotations[NAMES.assignment])
    ids = {s.name: s.container_id.removeprefix("containerd://") for s in pod.status.container_statuses}
    assert all(s.container_id.startswith("containerd://") for s in pod.status.container_statuses)

    for assigned in assignment.containers:
        [card] = assigned.cards
        path = f"{prefix}{card.index}"

        def holder(cname: str = assigned.name, path: str = path) -> dict[str, Any] | None:
            # Named once the agent's pod watch has the container's ID (kubelet reports it after start).
            mine = [h for h in device_holders(agent.usage_state).get(path, [])
                    if h["containerId"] == ids[cname] and h["container"]]
            return mine[0] if mine else None

        found = wait_for(holder, timeout=30, what=f"{assigned.name}'s open of {path} in the state file, named"
                         f"\n{agent.log()}")
        assert (found["namespace"], found["pod"], found["container"]) == (namespace, "job", assigned.name)
        pid = found["pid"]
        assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"3600"]
        assert f":/k8s.io/{ids[assigned.name]}\n" in Path(f"/proc/{pid}/cgroup").read_text()
        env = environ(pid)
        assert {k: env.get(k) for k in GRANT_KEYS} == expected_grant(namespace, "job", assigned.name, assigned.cards)
        assert Path(os.readlink(f"/proc/{pid}/fd/3")) == Path(path)  # the container's own node, same path
    print(f"  create to both opens in the state file: {time.monotonic() - created:.1f} s")

    core_v1.delete_namespaced_pod("job", namespace, grace_period_seconds=1)
    held = {f"{prefix}{c.index}" for a in assignment.containers for c in a.cards}
    wait_for(lambda: not any(device_holders(agent.usage_state).get(p) for p in held), timeout=60,
             what=f"the cards free after the pod is gone\n{agent.log()}")
    assert agent.running(), agent.log()


PRELOAD_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void hello(void) { printf("preloaded\n"); fflush(stdout); }
"""
MAIN_C = r"""
#include <stdio.h>
int main(void) { printf("dynamic main\n"); return 0; }
"""


def test_dynamic_image_runs_a_dynamic_program_with_a_preloaded_library(
    core_v1: client.CoreV1Api, namespace: str, containerd_kubelet: Kubelet, tmp_path: Path,
) -> None:
    gcc = shutil.which("gcc")
    assert gcc is not None  # installed with the runtime tools
    (tmp_path / "preload.c").write_text(PRELOAD_C)
    (tmp_path / "main.c").write_text(MAIN_C)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", tmp_path / "libpreload.so", tmp_path / "preload.c"], check=True)
    subprocess.run([gcc, "-o", tmp_path / "hello", tmp_path / "main.c"], check=True)
    image = build_image("dynamic-hello", {f"{LIB_DIR}/libpreload.so": tmp_path / "libpreload.so",
                                          "/usr/local/bin/hello": tmp_path / "hello"})
    containerd_kubelet.import_image(image)
    manifest = pod_manifest("dyn", containerd_kubelet.node_name, image.ref, {"main": {}},
                            "hello; LD_PRELOAD=libpreload.so hello; sleep 3600", {})
    core_v1.create_namespaced_pod(namespace, manifest)
    wait_for(lambda: running(core_v1, namespace, "dyn"), timeout=90, what="dyn Running")

    def full_log() -> str | None:
        log = str(core_v1.read_namespaced_pod_log("dyn", namespace))
        return log if len(log.splitlines()) >= 3 else None

    log = wait_for(full_log, timeout=30, what="dyn's log")
    assert log.splitlines() == ["dynamic main", "preloaded", "dynamic main"], log

    # As on a real node, a kubelet restart leaves the running containers alone.
    [before] = core_v1.read_namespaced_pod("dyn", namespace).status.container_statuses
    containerd_kubelet.restart()
    pod = core_v1.read_namespaced_pod("dyn", namespace)
    assert pod.status.phase == "Running"
    assert [(s.container_id, s.restart_count) for s in pod.status.container_statuses] == [(before.container_id, 0)]
