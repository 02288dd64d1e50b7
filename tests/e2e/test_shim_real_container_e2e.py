"""The interception library enforces a pod's memory share inside a real container.

Everything but the GPU is real: kube-scheduler calls ``gpupool extender``, a real kubelet runs the
pod through containerd and runc, and ``gpupool node-agent --isolation shim --shim-library <built
library>`` serves Allocate. The image holds the stand-in driver (``libcuda.so.1`` and
``libnvidia-ml.so.1``, built by the library tests' toolchain) where the real ones would be, and the
library tests' probe program (compiled on the host, dynamically linked). The pod spec names no
library: the library gets into the probe only through what Allocate handed out, the bind mounts of
the library and of ``/etc/ld.so.preload``, the per-container directory, the agent's socket and the
environment.

What it proves: a container granted 4 GiB of a 16 GiB card sees a 4 GiB card (``cuDeviceTotalMem``,
``cuMemGetInfo``), gets four 1 GiB allocations and is refused the fifth with
``CUDA_ERROR_OUT_OF_MEMORY`` (by symbol, and through ``cuGetProcAddress_v2``); the probe has the
library mapped without any ``LD_PRELOAD``; and the probe registered with the agent, which counts it
on ``/metrics`` and recorded its host pid, the pid its reply handed back to the library.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api.names import ResourceNames
from gpupool.api.shim_contract import CONTAINER_LIBRARY_PATH
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.e2e_support import ExtenderProcess, NodeAgentProcess, wait_for
from tests.e2e.probe_image import PROBE, STANDIN_STATE, probe_image, shim_agent
from tests.shim.toolchain import Step, parse_steps

pytestmark = pytest.mark.e2e

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

NAMES = ResourceNames()
GIB = 1 << 30
CARD_MIB = 16384
SHARE_UNITS = "16"  # gpu-mem units of 256 MiB: 4 GiB
SHARE_BYTES = 4 * GIB
OK, OUT_OF_MEMORY = 0, 2  # CUresult
#: First through cuGetProcAddress_v2 (the CUDA runtime's path), one process that exits; then by
#: symbol, a process that stays (``hold``) so that its registration can be read on the agent.
COMMAND = (f"echo run procaddress; {PROBE} procaddress alloc:4g alloc:1m; "
           f"echo run symbol; exec {PROBE} symbol total info alloc:1g alloc:1g alloc:1g alloc:1g alloc:1g info hold")
REGISTERED = re.compile(r"registered pid (\d+) \(pid (\d+) in its container\)")


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gsr", dir="/tmp"))  # short: the agent's socket lives below it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pod_manifest(node: str, image: str) -> dict[str, Any]:
    container = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["sh", "-c", COMMAND],
                 "env": [{"name": "GPUPOOL_STANDIN_STATE", "value": STANDIN_STATE},
                         {"name": "GPUPOOL_SHIM_LOG", "value": "info"}],
                 "resources": {"limits": {NAMES.gpu_mem: SHARE_UNITS}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "shim"},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 1,
                     "nodeSelector": {"kubernetes.io/hostname": node}}}


def runs(log: str) -> dict[str, list[Step]]:
    """The probe's steps in the container log, per ``echo run <mode>`` marker."""
    out: dict[str, list[Step]] = {}
    current: list[Step] = []
    for line in log.splitlines():
        if line.startswith("run "):
            current = out.setdefault(line.removeprefix("run "), [])
        else:
            current.extend(parse_steps(line))
    return out


def registered_counts(agent: NodeAgentProcess) -> dict[str, float]:
    return {s.labels["pod"]: s.value for f in text_string_to_metric_families(agent.metrics()) for s in f.samples
            if s.name == "gpupool_container_registered_processes"}


def test_a_pod_granted_4_gib_is_refused_its_fifth_gib_inside_a_real_container(
    core_v1: client.CoreV1Api, namespace: str, containerd_kubelet: Kubelet, tmp_path: Path, state_dir: Path,
    start_node_agent: Callable[..., NodeAgentProcess], gpupool_extender: ExtenderProcess,
) -> None:
    began = time.monotonic()
    kubelet = containerd_kubelet
    tc, image_ref = probe_image("shim-e2e", kubelet, tmp_path)
    print(f"\n  library, stand-in driver, probe and image: {time.monotonic() - began:.1f} s")
    node = kubelet.node_name
    agent = shim_agent(start_node_agent, kubelet, core_v1, tc, tmp_path / "dev", state_dir, card_mib=CARD_MIB)
    created = time.monotonic()
    manifest = pod_manifest(node, image_ref)
    assert "LD_PRELOAD" not in str(manifest)
    core_v1.create_namespaced_pod(namespace, manifest)

    def finished_log() -> str | None:
        pod = core_v1.read_namespaced_pod("shim", namespace)
        assert pod.status.phase not in ("Failed", "Succeeded"), (pod.status.phase, pod.status.container_statuses)
        if pod.status.phase != "Running":
            return None
        log = str(core_v1.read_namespaced_pod_log("shim", namespace, container="main"))
        return log if "hold 0" in log else None

    log = wait_for(finished_log, timeout=90, what=f"the probe at its hold step\n{agent.log()}")
    print(f"  pod create to the probe's last step: {time.monotonic() - created:.1f} s")
    steps = runs(log)
    by_proc = steps["procaddress"]
    assert [(s.text, s.code) for s in by_proc] == [("alloc:4g", OK), ("alloc:1m", OUT_OF_MEMORY)], log
    by_symbol = steps["symbol"]
    assert [(s.text, s.code) for s in by_symbol] == [
        ("total", OK), ("info", OK), *[("alloc:1g", OK)] * 4, ("alloc:1g", OUT_OF_MEMORY), ("info", OK), ("hold", OK),
    ], log
    total, first_info, last_info = by_symbol[0], by_symbol[1], by_symbol[7]
    assert int(total.values[0]) == SHARE_BYTES
    assert [int(v) for v in first_info.values] == [SHARE_BYTES, SHARE_BYTES]  # free, total
    assert [int(v) for v in last_info.values] == [0, SHARE_BYTES]

    registration = wait_for(lambda: REGISTERED.findall(agent.log()) or None, timeout=30,
                            what=f"the probe's registration in the agent's log\n{agent.log()}")
    counted = wait_for(lambda: registered_counts(agent).get("shim") or None, timeout=30,
                       what="the probe counted on /metrics")
    assert counted == 1.0
    host_pid, container_pid = (int(p) for p in registration[-1])
    assert container_pid == 1  # exec'd by the container's first process, in the container's pid namespace
    assert host_pid != container_pid
    assert Path(f"/proc/{host_pid}/cmdline").read_bytes().split(b"\0")[:2] == [PROBE.encode(), b"symbol"]
    assert CONTAINER_LIBRARY_PATH in Path(f"/proc/{host_pid}/maps").read_text()
    assert b"LD_PRELOAD=" not in Path(f"/proc/{host_pid}/environ").read_bytes()
    assert f"host pid {host_pid}" in log, log  # the reply carried it back into the container
