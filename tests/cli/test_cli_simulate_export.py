"""``gpupool simulate export`` without a cluster: the API's objects into trace rows, and the command's
refusals. tests/e2e/test_simulate_export_e2e.py runs it against a real apiserver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.cli.main import cli
from gpupool.cli.simulate_export import build_export
from gpupool.core.model import GpuCard

NAMES = ResourceNames()


def node(name: str, cards: int = 0, model: str = "Tesla-T4", memory: int = 16_384) -> dict[str, Any]:
    annotations = {}
    if cards:
        inventory = Inventory(tuple(GpuCard(i, f"GPU-{name}-{i}", model, memory) for i in range(cards)))
        annotations[NAMES.inventory] = encode_inventory(inventory)
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    return {"metadata": {"name": name, "annotations": annotations},
            "status": {"allocatable": resources, "capacity": resources}}


def pod(name: str, limits: dict[str, str] | None = None, *, node_name: str = "", phase: str = "Running",
        created: str = "2026-11-28T10:00:00Z", scheduled: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
    if limits:
        container["resources"]["limits"] = limits
    status: dict[str, Any] = {"phase": phase, "qosClass": "Burstable"}
    if scheduled:
        status["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}]
    return {"metadata": {"name": name, "namespace": "team-a", "creationTimestamp": created},
            "spec": {"containers": [container], "nodeName": node_name}, "status": status}


def test_nodes_and_pods_become_rows_on_the_traces_clock() -> None:
    export = build_export(
        [node("gpu-1", cards=2), node("cpu-1")],
        [pod("late", {NAMES.gpu_mem: "16", NAMES.gpu_core: "10"}, node_name="gpu-1",
             created="2026-11-28T10:01:40Z", scheduled="2026-11-28T10:01:42Z"),
         pod("early", {NAMES.gpu: "1"}, phase="Pending"),
         pod("cpu")], NAMES)
    assert export.nodes == [
        {"sn": "gpu-1", "cpu_milli": "16000", "memory_mib": "65536", "gpu": "2", "model": "Tesla-T4",
         "gpu_memory_mib": "16384"},
        {"sn": "cpu-1", "cpu_milli": "16000", "memory_mib": "65536", "gpu": "0", "model": "", "gpu_memory_mib": ""}]
    rows = {row["name"]: row for row in export.pods}
    assert list(rows) == ["team-a/early", "team-a/cpu", "team-a/late"]  # by creation time
    late = rows["team-a/late"]
    # 4 GiB of a 16 GiB card books a quarter of it, more than the 10 % compute
    assert (late["num_gpu"], late["gpu_milli"], late["creation_time"], late["scheduled_time"]) == ("1", "250", "100",
                                                                                                  "102")
    assert (late["cpu_milli"], late["memory_mib"], late["qos"], late["pod_phase"]) == ("500", "1024", "Burstable",
                                                                                      "Running")
    early = rows["team-a/early"]
    assert (early["num_gpu"], early["gpu_milli"], early["scheduled_time"], early["pod_phase"]) == ("1", "1000", "",
                                                                                                  "Pending")
    assert rows["team-a/cpu"]["num_gpu"] == "0"
    assert export.skipped == [] and export.gpus == 2 and export.gpu_pods == 2


def test_a_waiting_pods_memory_is_measured_against_the_clusters_usual_card() -> None:
    nodes = [node("big", cards=1, model="H200", memory=143_360), node("small-1", cards=4), node("small-2", cards=4)]
    export = build_export(nodes, [pod("waiting", {NAMES.gpu_mem: "32"})], NAMES)  # 8 GiB
    assert export.pods[0]["gpu_milli"] == "500"  # half of a 16 GiB card, the usual one here


def test_finished_pods_are_left_out_unless_asked_for() -> None:
    pods = [pod("done", phase="Succeeded"), pod("failed", phase="Failed"), pod("running")]
    assert [r["name"] for r in build_export([node("n")], pods, NAMES).pods] == ["team-a/running"]
    assert build_export([node("n")], pods, NAMES).finished == 2
    assert len(build_export([node("n")], pods, NAMES, include_finished=True).pods) == 3


def test_what_the_format_cannot_hold_is_left_out_with_the_reason() -> None:
    two = pod("two", {NAMES.gpu: "1"})
    two["spec"]["containers"].append({"name": "side", "resources": {"limits": {NAMES.gpu: "1"}}})
    broken = pod("broken", {NAMES.gpu_mem: "lots"})
    bad_node = node("bad")
    bad_node["metadata"]["annotations"][NAMES.inventory] = "{not json"
    mixed = node("mixed", cards=1)
    mixed_inventory = Inventory((GpuCard(0, "GPU-m-0", "T4", 16_384), GpuCard(1, "GPU-m-1", "A10", 24_576)))
    mixed["metadata"]["annotations"][NAMES.inventory] = encode_inventory(mixed_inventory)
    export = build_export([bad_node, mixed], [two, broken, pod("fine")], NAMES)
    assert [r["sn"] for r in export.nodes] == ["mixed"] and export.nodes[0]["model"] == "T4"
    assert [r["name"] for r in export.pods] == ["team-a/fine"]
    reasons = "\n".join(export.skipped)
    assert "node bad" in reasons
    assert "node mixed: cards of several models, written as T4" in reasons
    assert "pod team-a/two: 2 containers ask for GPUs" in reasons
    assert "pod team-a/broken" in reasons and "lots" in reasons


def test_existing_outputs_are_not_overwritten_without_force(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text("keep")
    result = CliRunner().invoke(cli, ["simulate", "export", "--nodes-out", str(tmp_path / "nodes.csv"),
                                      "--pods-out", str(tmp_path / "pods.csv")])
    assert result.exit_code == 1 and "exists; add --force to overwrite it" in result.output
    assert (tmp_path / "nodes.csv").read_text() == "keep"


def test_an_unreachable_cluster_is_a_one_line_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
                          "users: [{name: u, user: {token: t}}]\n"
                          "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n")
    result = CliRunner().invoke(cli, ["simulate", "export", "--kubeconfig", str(kubeconfig),
                                      "--nodes-out", str(tmp_path / "n.csv"), "--pods-out", str(tmp_path / "p.csv")])
    assert result.exit_code == 1, result.output
    assert "cannot reach the API server" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "n.csv").exists()


@pytest.mark.parametrize("args", [
    pytest.param(["--seeds", "3", "export"], id="seeds"),
    pytest.param(["--plot", "x.png", "export"], id="plot"),
])
def test_replay_options_before_export_are_refused(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["simulate", *args])
    assert result.exit_code == 2 and "do not apply to `gpupool simulate export`" in result.output
