"""``gpupool simulate --tenants qos --quotas FILE``: the per-tenant report and the quota file."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpupool.cli.main import cli
from tests.cli.test_cli_simulate import NODES_CSV, PODS_CSV


def run(tmp_path: Path, quotas: str | None, *extra: str) -> tuple[int, str]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES_CSV)
    pods.write_text(PODS_CSV.replace("p3,1000,1024,1,1000,,LS", "p3,1000,1024,1,1000,,BE"))
    args = ["simulate", "--nodes", str(nodes), "--trace", str(pods), "--policy", "bestfit", "--tenants", "qos"]
    if quotas is not None:
        (tmp_path / "q.yaml").write_text(quotas)
        args += ["--quotas", str(tmp_path / "q.yaml")]
    result = CliRunner().invoke(cli, [*args, *extra])
    return result.exit_code, result.output


def test_per_tenant_json_with_a_quota(tmp_path: Path) -> None:
    code, out = run(tmp_path, "LS: {hard: {wholeGpus: 2}}\n", "--json")
    assert code == 0, out
    tenants = {t["tenant"]: t for t in json.loads(out)["policies"][0]["tenants"]}
    assert (tenants["LS"]["placed"], tenants["LS"]["refused_by_quota"]) == (2, 1)
    assert tenants["LS"]["first_quota_reason"] == "GpuQuota LS/simulated: whole GPUs limit 2, used 2, asked 1"
    assert (tenants["BE"]["placed"], tenants["BE"]["refused_by_quota"]) == (1, 0)


def test_table_without_quotas(tmp_path: Path) -> None:
    code, out = run(tmp_path, None)
    assert code == 0, out
    assert "no quotas" in out and out.count("\n") >= 4


def test_a_broken_quota_file_names_the_field(tmp_path: Path) -> None:
    code, out = run(tmp_path, "LS: {hard: {wholeGpus: many}}\n")
    assert code != 0
    assert "GpuQuota LS/simulated: spec.hard.wholeGpus: expected an integer, got 'many'" in out
