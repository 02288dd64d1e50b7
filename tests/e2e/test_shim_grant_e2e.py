"""The interception library's grant through a real kubelet: ``gpupool node-agent --shim-library``.

kube-scheduler + the extender place a pod asking for ``gpu-mem`` and ``gpu-core`` (two resources,
so kubelet calls Allocate twice and merges the answers); the fake runtime prints the container's
env. What it proves: the container gets one token (the merged answers agreed), the contract's
variables next to the unchanged grant, its own directory on the host holding that token, and a
process presenting the token to the agent's socket is registered and counted on ``/metrics``,
where every card reports the library as its backend.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from gpupool.api import environment as env
from gpupool.api.annotations import decode_assignment
from gpupool.api.names import ResourceNames
from gpupool.api.shim_contract import RegisterRequest, is_token
from gpupool.shim.build import ShimBuildError, build_library, find_compiler
from tests.e2e.e2e_support import (
    GRANT_KEYS,
    ExtenderProcess,
    NodeAgentProcess,
    StartKubelet,
    env_from_log,
    expected_grant,
    gpu_pod_manifest,
    wait_for,
)
from tests.nodeagent.isolation.shim_client import registered_child

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
GPUS = """\
model: Tesla-T4
cards:
  - {uuid: GPU-shim-0000, memoryMiB: 16384}
  - {uuid: GPU-shim-0001, memoryMiB: 16384}
topology: [[0, 1]]
"""


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gse", dir="/tmp"))  # short: the agent's socket lives below it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def samples(agent: NodeAgentProcess, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for f in text_string_to_metric_families(agent.metrics()) for s in f.samples
            if s.name == name]


def test_a_pod_gets_the_library_mounts_token_and_registers(
    core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet,
    start_node_agent: Callable[..., NodeAgentProcess], gpupool_extender: ExtenderProcess, state_dir: Path,
) -> None:
    # the agent mounts the library into the container (the fake runtime runs nothing), but it must be
    # one the dynamic loader can load: an agent whose library cannot be loaded takes whole cards only
    try:
        find_compiler()
    except ShimBuildError as exc:
        pytest.skip(f"cannot build the interception library here: {exc}")
    library = state_dir / "libgpupool-shim.so"
    shutil.copy(build_library(), library)
    node = f"e2e-shim-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(node)
    agent = start_node_agent(kubelet, GPUS, ("--shim-library", str(library), "--state-dir", str(state_dir),
                                             "--compute-mode", "soft"))
    wait_for(lambda: (core_v1.read_node(node).status.allocatable or {}).get(NAMES.gpu_mem) == "128",
             timeout=60, what=f"gpupool devices on {node}\n{agent.log()}")

    limits = {NAMES.gpu_mem: "16", NAMES.gpu_core: "30"}
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("shim", [("main", limits)], node=node))

    def started() -> dict[str, str] | None:
        pod = core_v1.read_namespaced_pod("shim", namespace)
        if pod.status.phase != "Running":
            return None
        return env_from_log(str(core_v1.read_namespaced_pod_log("shim", namespace, container="main"))) or None

    got = wait_for(started, timeout=90, what=f"shim pod Running with its env\n{agent.log()}")
    pod = core_v1.read_namespaced_pod("shim", namespace)
    [assigned] = decode_assignment(pod.metadata.annotations[NAMES.assignment]).containers
    assert {k: got.get(k) for k in GRANT_KEYS} == expected_grant(namespace, "shim", "main", assigned.cards)
    token = got[env.SHIM_TOKEN]
    assert is_token(token)
    assert (got[env.SHIM_DIR], got[env.AGENT_SOCKET], got[env.COMPUTE_MODE]) == (
        "/var/run/gpupool", "/var/run/gpupool-agent/agent.sock", "soft")
    host_dir = state_dir / "containers" / f"{pod.metadata.uid}_main"
    assert (host_dir / "token").read_text() == token + "\n"
    assert (state_dir / "shim" / "ld.so.preload").read_text() == "/usr/local/gpupool/lib/libgpupool-shim.so\n"

    in_force = {labels["card"]: labels["backend"]
                for labels, value in samples(agent, "gpupool_card_isolation_backend") if value == 1}
    assert in_force == {"0": "shim", "1": "shim"}
    request = RegisterRequest(token, 1, f"{namespace}/shim", "main")
    with registered_child(str(state_dir / "agent-socket" / "agent.sock"), request) as (_child, reply):
        assert reply.ok, reply.reason
        counted = {labels["pod"]: value for labels, value in samples(agent, "gpupool_container_registered_processes")}
        assert counted == {"shim": 1.0}
    assert "registered pid" in agent.log()
