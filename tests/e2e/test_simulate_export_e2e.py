"""``gpupool simulate export`` against the real apiserver: nodes with gpupool's inventory and pods as
the API serves them (defaults, timestamps, QoS class filled in by the server), in paged lists, read
into CSVs that ``gpupool simulate`` replays."""

from __future__ import annotations

import csv
import os
import subprocess
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from kubernetes import client

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.cli import simulate_export
from gpupool.cli.main import cli
from gpupool.core.model import GpuCard
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import GPUPOOL_CLI, NO_SCHEDULER, REPO, MakeNode, pod_manifest

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()


def gpupool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUPOOL_CLI, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_live_clusters_nodes_and_pods_replay_in_the_simulator(
        control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = uuid.uuid4().hex[:6]
    cards = tuple(GpuCard(i, f"GPU-{run}-{i}", "NVIDIA-H200", 143_771) for i in range(4))
    gpu_node = make_node(f"export-gpu-{run}", {"cpu": "64", "memory": "512Gi"},
                         annotations={NAMES.inventory: encode_inventory(Inventory(cards))})
    cpu_node = make_node(f"export-cpu-{run}")
    slice_pod = pod_manifest("slice", limits={NAMES.gpu_mem: "64", NAMES.gpu_core: "20", "cpu": "2",
                                              "memory": "8Gi"}, scheduler_name=NO_SCHEDULER)
    whole_pod = pod_manifest("whole", limits={NAMES.gpu: "2"}, scheduler_name=NO_SCHEDULER)
    cpu_pod = pod_manifest("cpu", scheduler_name=NO_SCHEDULER)
    two_gpu = pod_manifest("two-gpu", limits={NAMES.gpu: "1"}, scheduler_name=NO_SCHEDULER)
    two_gpu["spec"]["containers"].append({"name": "side", "image": "busybox:1.36",
                                          "resources": {"limits": {NAMES.gpu: "1"}}})
    for body in (slice_pod, whole_pod, cpu_pod, two_gpu):
        core_v1.create_namespaced_pod(namespace, body)
    monkeypatch.setattr(simulate_export, "PAGE", 2)  # several pages even on a small cluster (in-process run)

    nodes_csv, pods_csv = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    result = CliRunner().invoke(cli, [
        "simulate", "export", "--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace,
        "--nodes-out", str(nodes_csv), "--pods-out", str(pods_csv)])
    assert result.exit_code == 0, f"{result.output}\n{result.stderr}"
    assert f"pod {namespace}/two-gpu: 2 containers ask for GPUs" in result.stderr

    by_node = {row["sn"]: row for row in rows(nodes_csv)}
    assert by_node[gpu_node] == {"sn": gpu_node, "cpu_milli": "64000", "memory_mib": str(512 * 1024), "gpu": "4",
                                 "model": "NVIDIA-H200", "gpu_memory_mib": "143771"}
    assert by_node[cpu_node]["gpu"] == "0"
    by_pod = {row["name"]: row for row in rows(pods_csv)}
    assert set(by_pod) == {f"{namespace}/slice", f"{namespace}/whole", f"{namespace}/cpu"}
    sliced = by_pod[f"{namespace}/slice"]
    # 16 GiB of a 140 GiB card is 114 milli, less than the 20 % compute; the pod waits (no scheduler)
    assert (sliced["num_gpu"], sliced["gpu_milli"], sliced["cpu_milli"], sliced["memory_mib"]) == ("1", "200", "2000",
                                                                                                  "8192")
    assert (sliced["pod_phase"], sliced["qos"], sliced["scheduled_time"]) == ("Pending", "Guaranteed", "")
    assert (by_pod[f"{namespace}/whole"]["num_gpu"], by_pod[f"{namespace}/whole"]["gpu_milli"]) == ("2", "1000")
    assert by_pod[f"{namespace}/cpu"]["qos"] == "BestEffort"

    replay = gpupool("simulate", "--nodes", str(nodes_csv), "--trace", str(pods_csv), "--policy", "gpupool",
                     "--policy", "fgd", "--seeds", "1", "--jobs", "1", "--json")
    assert replay.returncode == 0, replay.stderr
    assert '"policies"' in replay.stdout
