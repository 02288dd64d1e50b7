"""One cluster configuration end to end: a node whose agent runs with another gpushare unit than
the extender gets no GPU pod, with a reason naming both values; a node that agrees gets its pod.

Everything real (the test environment's current Kubernetes): the ConfigMap of shared settings in
the test namespace (``--cluster-config``), a ``gpupool extender`` process reading it, kube-scheduler
calling the extender, two kubelets, each served by ``gpupool node-agent --fake-gpus`` reading the
same ConfigMap; one agent overrides ``--gpushare-memory-unit`` (what an admin's leftover flag does).
``kubectl gpupool why`` then names that node with the same words.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.cluster_settings import (
    AGENT_SETTINGS,
    AGENT_SETTINGS_ANNOTATION,
    CONFIG_MAP_NAME,
    ClusterSettings,
    Setting,
    read_published,
)
from gpupool.api.names import ResourceNames
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import NodeAgentProcess, StartKubelet, gpu_pod_manifest, wait_for
from tests.e2e.trust_support import FlaggedExtender, filter_reason, scheduled_through

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

NAMES = ResourceNames()
GPUS = """\
model: Tesla-T4
cards:
  - {uuid: GPU-CARD-0000, memoryMiB: 16384}
"""
SLICE = [("main", {NAMES.gpu_mem: "8", NAMES.gpu_core: "10"})]
MISMATCH = "counts gpushare memory (aliyun.com/gpu-mem) in MiB, the extender in GiB"


@pytest.fixture
def configured_extender(control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
                        tmp_path: Path) -> Iterator[FlaggedExtender]:
    """The shared settings in ConfigMap ``<namespace>/gpupool-cluster`` (the agents' Leases in the test
    namespace), an extender reading them, and the scheduler calling it."""
    core_v1.create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=CONFIG_MAP_NAME),
        data={"gpushareMemoryUnit": "GiB", "agentLeaseNamespace": namespace}))
    yield from scheduled_through(control_plane, FlaggedExtender(
        control_plane.kubeconfig, tmp_path / "extender.log",
        extra_args=("--cluster-config", f"{namespace}/{CONFIG_MAP_NAME}")))


def failed_reason(extender: FlaggedExtender, node: str) -> str | None:
    """The extender's filter reason for ``node`` about a GPU pod (None: it passes)."""
    return filter_reason(extender, SLICE, node)


def unschedulable_message(core_v1: client.CoreV1Api, namespace: str, name: str) -> str | None:
    pod = core_v1.read_namespaced_pod(name, namespace)
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False" and MISMATCH in (cond.message or ""):
            return str(cond.message)
    return None


def test_a_node_whose_agent_counts_gpushare_memory_otherwise_is_refused_and_a_matching_one_is_used(
        configured_extender: FlaggedExtender, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
        start_kubelet: StartKubelet, start_node_agent: Callable[..., NodeAgentProcess]) -> None:
    extender = configured_extender
    suffix = uuid.uuid4().hex[:6]
    same, other = f"same-{suffix}", f"mib-{suffix}"
    config = ("--cluster-config", f"{namespace}/{CONFIG_MAP_NAME}", "--no-usage-monitor")
    agents = {same: start_node_agent(start_kubelet(same), GPUS, config),
              other: start_node_agent(start_kubelet(other), GPUS, (*config, "--gpushare-memory-unit", "MiB"))}

    def published(node: str) -> dict[Any, Any] | None:
        assert agents[node].running(), agents[node].log()
        status = core_v1.read_node(node)
        text = (status.metadata.annotations or {}).get(AGENT_SETTINGS_ANNOTATION)
        served = (status.status.allocatable or {}).get(NAMES.gpu) == "1"
        return read_published(text, node) if text is not None and served else None

    for node in agents:
        wait_for(lambda n=node: published(n), timeout=90, what=f"{node}'s devices and settings:\n{agents[node].log()}")
    as_run = ClusterSettings(agent_lease_namespace=namespace)
    expected = {s: as_run.value(s) for s in AGENT_SETTINGS}
    assert published(same) == expected
    assert published(other) == expected | {Setting.GPUSHARE_MEMORY_UNIT: "MiB"}

    reason = wait_for(lambda: failed_reason(extender, other), timeout=20, what=f"{other} refused by filter")
    assert f"node {other} {MISMATCH}" in reason
    assert f"Set gpushareMemoryUnit once in ConfigMap {namespace}/{CONFIG_MAP_NAME}" in reason
    assert "drop --gpushare-memory-unit" in reason
    wait_for(lambda: failed_reason(extender, same) is None, timeout=20, what=f"{same} passing filter")

    # through kube-scheduler: a pod pinned to the node that differs waits with the reason; the other runs
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("pinned-other", SLICE, node=other))
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("pinned-same", SLICE, node=same))
    message = wait_for(lambda: unschedulable_message(core_v1, namespace, "pinned-other"), timeout=60,
                       what="'pinned-other' unschedulable with the extender's reason")
    assert f"node {other}" in message

    def scheduling_event() -> str | None:  # kube-scheduler's Event on the pod carries the extender's reason
        events = core_v1.list_namespaced_event(namespace, field_selector="involvedObject.name=pinned-other").items
        found = [str(e.message) for e in events if e.reason == "FailedScheduling" and MISMATCH in (e.message or "")]
        return found[0] if found else None

    wait_for(scheduling_event, timeout=30, what="a FailedScheduling Event with the extender's reason")

    def placed(name: str) -> tuple[str | None, str]:
        pod = core_v1.read_namespaced_pod(name, namespace)
        return pod.spec.node_name, str(pod.status.phase)

    wait_for(lambda: placed("pinned-same") == (same, "Running"), timeout=60, what="'pinned-same' Running")
    assert placed("pinned-other")[0] is None

    # kubectl gpupool why says the same, comparing the node with the ConfigMap's values
    done = subprocess.run([sys.executable, "-m", "gpupool.kubectl", "why", "pinned-other", "-n", namespace,
                           "--kubeconfig", str(control_plane.kubeconfig), "--cluster-config",
                           f"{namespace}/{CONFIG_MAP_NAME}", "--agent-lease-namespace", namespace, "--examples", "0"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"node {other} counts gpushare memory (aliyun.com/gpu-mem) in MiB, the cluster configuration in GiB" \
        in done.stdout, done.stdout
