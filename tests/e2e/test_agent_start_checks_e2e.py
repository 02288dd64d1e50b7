"""The node agent's start-up checks against the real apiserver (issue 23: a platform engineer learns at
once, in one place, what works on a node and what does not).

An agent pointed at a wrong ``--plugin-dir`` and no PodResources socket (a DaemonSet with kubelet's
directories not mounted): it logs each check with what to do and writes their summary on its Node
(``gpupool.io/agent-checks``, what ``kubectl describe node`` shows); with ``--exit-on-failed-check``
(the chart's and the kustomize package's choice) it stops at once, exit 1, naming the failed checks,
and publishes nothing the extender would place pods by.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from gpupool.api.cluster_settings import AGENT_CHECKS_ANNOTATION as CHECKS_ANNOTATION
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import MakeNode, NodeAgentProcess, wait_for

pytestmark = [pytest.mark.e2e]

GPUS = "cards:\n  - {model: A100, memoryMiB: 40960}\n"
START_S = 30.0


@dataclass(frozen=True)
class NotMounted:
    """What NodeAgentProcess reads of a kubelet: host paths where nothing was mounted."""

    node_name: str
    device_plugin_dir: Path
    pod_resources_socket: Path


def _agent(control_plane: ControlPlane, node: str, tmp_path: Path, *extra: str) -> NodeAgentProcess:
    paths = NotMounted(node, tmp_path / "not-the-device-plugins-dir", tmp_path / "pod-resources" / "kubelet.sock")
    return NodeAgentProcess(paths, control_plane.kubeconfig, GPUS, tmp_path,  # type: ignore[arg-type]
                            ("--no-usage-monitor", *extra))


def test_the_agent_logs_its_checks_and_writes_them_on_its_node(
        control_plane: ControlPlane, core_v1: client.CoreV1Api, make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node()
    agent = _agent(control_plane, node, tmp_path)
    agent.start()
    try:
        text = wait_for(lambda: (core_v1.read_node(node).metadata.annotations or {}).get(CHECKS_ANNOTATION),
                        timeout=START_S, what=f"{CHECKS_ANNOTATION} on the node")
        assert " at start: 1 ok, 3 warn, 2 fail; " in text, text
        assert "fail device plugins: " in text and "fail pod resources: " in text and "warn enforcement: " in text
        assert agent.running(), agent.log()  # without --exit-on-failed-check it runs, the failures logged
        log = agent.log_path.read_text()  # the whole log: the checks come first
        assert "ERROR gpupool.nodeagent.selfcheck: start-up check fail device plugins: " in log, log
        assert "start-up check ok gpus: 1 card(s): A100" in log, log
    finally:
        agent.stop()


def test_with_exit_on_failed_check_the_agent_stops_at_once_naming_the_failures(
        control_plane: ControlPlane, core_v1: client.CoreV1Api, make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node()
    agent = _agent(control_plane, node, tmp_path, "--exit-on-failed-check")
    started = time.monotonic()
    agent.start()
    try:
        wait_for(lambda: not agent.running(), timeout=START_S, what="the agent to stop")
    finally:
        status = agent.stop()
    assert status == 1, agent.log()
    assert "start-up check failed (device plugins, pod resources)" in agent.log(), agent.log()
    annotations = core_v1.read_node(node).metadata.annotations or {}
    assert not any(key.startswith("gpupool.io/") for key in annotations), annotations
    print(f"[start checks] the agent stopped {time.monotonic() - started:.1f} s after its start")
