"""``gpupool node-agent --dra``: what it refuses before serving (a risk action it cannot honour yet,
an unreadable checkpoint), with the reason and without a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli.main import cli

GPUS = "model: Tesla-T4\ncards:\n  - {uuid: GPU-cli-0, memoryMiB: 8192}\n"
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def agent_args(tmp_path: Path, *extra: str) -> list[str]:
    (tmp_path / "gpus.yaml").write_text(GPUS)
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    return ["node-agent", "--cluster-config", "", "--fake-gpus", str(tmp_path / "gpus.yaml"),
            "--kubeconfig", str(tmp_path / "kubeconfig"), "--no-usage-monitor", "--metrics-port", "0",
            "--isolation", "none", "--plugin-dir", str(tmp_path / "dp"), "--dra",
            "--dra-kubelet-dir", str(tmp_path / "kubelet"), "--cdi-dir", str(tmp_path / "cdi"), *extra]


def test_dra_refuses_a_risk_action_that_would_act_on_its_own_containers(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, agent_args(tmp_path, "--risk-action", "evict"))
    assert result.exit_code == 2, result.output
    assert "evict cannot be combined with --dra yet" in result.output and "--risk-action=report" in result.output


@pytest.mark.slow
def test_an_unreadable_checkpoint_stops_the_agent_with_the_file_named(tmp_path: Path) -> None:
    checkpoint = tmp_path / "prepared.json"
    checkpoint.write_text("{half a file")
    result = CliRunner().invoke(cli, agent_args(tmp_path, "--dra-checkpoint", str(checkpoint)))
    assert result.exit_code == 1, result.output
    assert f"the DRA checkpoint {checkpoint} is not readable" in result.output
    assert "move it away to start empty" in result.output
    assert "Traceback" not in result.output
