"""A virtual card in a real container: a slice of two cards served by one card, seen as two devices.

Seed 003's rule (docs/virtual-cards.md): a pod asks for 4 GiB on each of two cards
(``gpupool.io/gpu-shared: 2``) and allows a virtual card (``gpupool.io/virtual-cards: shared``).
kube-scheduler with ``gpupool extender`` books one card of the node for both slices (8 GiB,
``devices: 2`` in its ``assignment-v1``); ``gpupool node-agent --isolation shim`` grants that card
with ``virtual_devices=2``; in a real container (containerd + runc, the stand-in driver and the
library tests' probe in the image) the program sees two CUDA devices of 4 GiB each, may fill each,
and is refused a byte more: the card is never asked for more than the 8 GiB the pod was booked.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.annotations import decode_assignment
from gpupool.api.names import ResourceNames
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.e2e_support import ExtenderProcess, NodeAgentProcess, wait_for
from tests.e2e.probe_image import PROBE, STANDIN_STATE, probe_image, shim_agent
from tests.shim.toolchain import parse_steps

pytestmark = pytest.mark.e2e

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

NAMES = ResourceNames()
GIB = 1 << 30
CARD_MIB = 16384
OK, OUT_OF_MEMORY = 0, 2  # CUresult
COMMAND = (f"{PROBE} symbol count totalof:0 totalof:1 use:1 alloc:4g alloc:1 use:0 alloc:4g alloc:1; "
           "echo DONE; sleep 3600")


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gvc", dir="/tmp"))  # short: the agent's socket lives below it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pod_manifest(node: str, image: str) -> dict[str, Any]:
    container = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["sh", "-c", COMMAND],
                 "env": [{"name": "GPUPOOL_STANDIN_STATE", "value": STANDIN_STATE}],
                 "resources": {"limits": {NAMES.gpu_mem: "16", NAMES.gpu_shared: "2"}}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "virtual", "annotations": {NAMES.virtual_cards: "shared"}},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 1,
                     "nodeSelector": {"kubernetes.io/hostname": node}}}


def test_a_two_card_slice_on_one_card_is_two_devices_in_the_container(
    core_v1: client.CoreV1Api, namespace: str, containerd_kubelet: Kubelet, tmp_path: Path, state_dir: Path,
    start_node_agent: Callable[..., NodeAgentProcess], gpupool_extender: ExtenderProcess,
) -> None:
    kubelet = containerd_kubelet
    tc, image = probe_image("virtual-card-e2e", kubelet, tmp_path)
    node = kubelet.node_name
    agent = shim_agent(start_node_agent, kubelet, core_v1, tc, tmp_path / "dev", state_dir, card_mib=CARD_MIB)
    core_v1.create_namespaced_pod(namespace, pod_manifest(node, image))

    def finished_log() -> str | None:
        pod = core_v1.read_namespaced_pod("virtual", namespace)
        assert pod.status.phase not in ("Failed", "Succeeded"), (pod.status.phase, pod.status.container_statuses)
        if pod.status.phase != "Running":
            return None
        log = str(core_v1.read_namespaced_pod_log("virtual", namespace, container="main"))
        return log if "DONE" in log else None

    log = wait_for(finished_log, timeout=120, what=f"the probe's steps\n{agent.log()}")
    pod = core_v1.read_namespaced_pod("virtual", namespace)
    assignment = decode_assignment(pod.metadata.annotations[NAMES.assignment])
    (main,) = assignment.containers
    assert [(c.memory_mib, c.devices) for c in main.cards] == [(8192, 2)], assignment  # one card, two devices
    steps = parse_steps(log)
    assert [(s.text, s.code) for s in steps] == [
        ("count", OK), ("totalof:0", OK), ("totalof:1", OK), ("use:1", OK), ("alloc:4g", OK),
        ("alloc:1", OUT_OF_MEMORY), ("use:0", OK), ("alloc:4g", OK), ("alloc:1", OUT_OF_MEMORY)], log
    assert steps[0].values == ("2",)
    assert [s.values[0] for s in steps[1:3]] == [str(4 * GIB)] * 2
