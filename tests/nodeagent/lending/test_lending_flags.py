"""``gpupool node-agent``'s lending flags reach the lending options; values out of range stop the start."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli import node_agent_cmd
from gpupool.cli.main import cli
from gpupool.nodeagent.lending.options import ActivityThresholds, LendingOptions
from gpupool.nodeagent.options import AgentOptions


def test_the_flags_reach_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[LendingOptions | None] = []

    async def run(options: AgentOptions) -> None:
        seen.append(options.lending)

    monkeypatch.setattr(node_agent_cmd, "run_agent", run)
    result = CliRunner().invoke(cli, ["node-agent", "--lending", "--state-dir", "/s", "--owner-active-percent", "25",
                                      "--owner-active-memory", "512", "--owner-active-samples", "4",
                                      "--cuda-checkpoint-timeout", "0"])
    assert result.exit_code == 0, result.output
    [options] = seen
    assert options is not None
    assert options.activity == ActivityThresholds(25, 512, 4)
    assert (options.cuda_checkpoint_timeout_s, options.shim_state_dir) == (0.0, "/s")


def test_criu_reaches_the_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[LendingOptions | None] = []

    async def run(options: AgentOptions) -> None:
        seen.append(options.lending)

    monkeypatch.setattr(node_agent_cmd, "run_agent", run)
    (tmp_path / "criu").write_text("")
    result = CliRunner().invoke(cli, ["node-agent", "--lending", "--criu", str(tmp_path / "criu"),
                                      "--criu-dir", "/dev/shm/t"])
    assert result.exit_code == 0, result.output
    assert [(o.criu, o.criu_tools_dir) if o else None for o in seen] == [(str(tmp_path / "criu"), "/dev/shm/t")]
    missing = CliRunner().invoke(cli, ["node-agent", "--lending", "--criu", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "--criu" in missing.output


@pytest.mark.parametrize("flag", [pytest.param(["--owner-active-percent", "0"], id="percent-0"),
                                  pytest.param(["--owner-active-percent", "101"], id="percent-101"),
                                  pytest.param(["--owner-active-memory", "0"], id="memory-0"),
                                  pytest.param(["--owner-active-samples", "0"], id="samples-0"),
                                  pytest.param(["--cuda-checkpoint-timeout", "-1"], id="negative-timeout")])
def test_values_out_of_range_are_refused(flag: list[str]) -> None:
    result = CliRunner().invoke(cli, ["node-agent", "--lending", *flag])
    assert result.exit_code == 2 and flag[0] in result.output
