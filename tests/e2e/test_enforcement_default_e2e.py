"""Enforcement on by default, end to end: a node agent that has nothing to enforce shares with takes
whole cards only (docs/isolation-backends.md, "Enforcement on by default").

``gpupool node-agent`` with the default ``--isolation auto`` and no interception library (a
checkout where none is packaged, no ``--shim-library``) publishes ``enforcement-v1`` with
``shares: false``; kube-scheduler + the extender then keep a 4 GiB slice off the node with the
node's reason, and place a whole card there, which kubelet admits and the agent grants.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from gpupool.api.cluster_settings import AGENT_CHECKS_ANNOTATION
from gpupool.api.names import ResourceNames
from gpupool.nodeagent.isolation.backends import packaged_library
from tests.e2e.e2e_support import (
    ContainerLimits,
    ExtenderProcess,
    NodeAgentProcess,
    StartKubelet,
    gpu_pod_manifest,
    wait_for,
)
from tests.e2e.test_gpu_pod_e2e import running, unschedulable

pytestmark = [pytest.mark.e2e]

NAMES = ResourceNames()
GPUS = "model: Tesla-T4\ncards:\n  - {uuid: GPU-enf-0, memoryMiB: 16384}\n  - {uuid: GPU-enf-1, memoryMiB: 16384}\n"


NO_LIBRARY = "auto, no library"
UNLOADABLE = "shim, a library that cannot be loaded"


@pytest.mark.parametrize("case", [
    pytest.param(NO_LIBRARY, marks=pytest.mark.skipif(
        packaged_library() is not None, reason="an interception library is packaged here: auto enforces")),
    UNLOADABLE])
def test_a_node_that_cannot_enforce_takes_whole_cards_only(
        core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet,
        start_node_agent: Callable[..., NodeAgentProcess], gpupool_extender: ExtenderProcess, tmp_path: Path,
        case: str) -> None:
    """The unloadable case: ``--isolation shim`` naming a file the dynamic loader refuses (the start-up
    probe loads it in a child process) publishes no shares, says why on the Node and fails the
    ``enforcement`` check in ``gpupool.io/agent-checks``; the whole card is proved by the first case."""
    node = f"e2e-enf-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(node)
    if case == NO_LIBRARY:
        agent = start_node_agent(kubelet, GPUS, ("--isolation", "auto"))
    else:
        broken = tmp_path / "libgpupool-shim.so"
        broken.write_bytes(b"\x7fELF but not a shared object the loader can map")
        agent = start_node_agent(kubelet, GPUS, ("--isolation", "shim", "--shim-library", str(broken)))

    def notice() -> dict[str, object] | None:
        assert agent.running(), agent.log()
        text = (core_v1.read_node(node).metadata.annotations or {}).get(NAMES.enforcement)
        return json.loads(text) if text else None

    published = wait_for(notice, timeout=60, what=f"{node}'s enforcement-v1 annotation\n{agent.log()}")
    assert published["backend"] == "none" and published["shares"] is False and published["enforcing"] is False
    assert "no GPU shares on this node, whole cards only" in agent.log()
    why = "no interception library" if case == NO_LIBRARY else "cannot be loaded"
    assert why in str(published["reason"]), published

    slice_pod: list[ContainerLimits] = [("main", {NAMES.gpu_mem: "16", NAMES.gpu_core: "30"})]
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("slice", slice_pod, node=node))
    message = wait_for(lambda: unschedulable(core_v1, namespace, "slice"), timeout=60,
                       what="the slice marked unschedulable")
    assert "whole GPUs only" in message and why in message, message
    if case == UNLOADABLE:
        checks = wait_for(lambda: (core_v1.read_node(node).metadata.annotations or {}).get(AGENT_CHECKS_ANNOTATION),
                          timeout=30, what=f"{AGENT_CHECKS_ANNOTATION} on {node}")
        assert "fail enforcement: " in checks, checks
        return  # the whole card goes as in the first case: the same path once the node has no shares

    whole: list[ContainerLimits] = [("main", {NAMES.gpu: "1"})]
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("whole", whole, node=node))
    wait_for(lambda: running(core_v1, namespace, "whole"), timeout=90, what=f"whole Running\n{agent.log()}")
