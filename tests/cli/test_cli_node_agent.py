"""``gpupool node-agent`` flags that fail before anything starts."""

from __future__ import annotations

from click.testing import CliRunner

from gpupool.cli.main import cli


def test_unknown_alias_family_is_refused_at_start() -> None:
    """A typo in a DaemonSet's --serve-aliases must stop the agent, not silently serve nothing."""
    result = CliRunner().invoke(cli, ["node-agent", "--serve-aliases", "gpushare,volcano"])
    assert result.exit_code == 2
    assert "unknown alias family 'volcano'" in result.output and "gpumanager" in result.output


def test_help_names_the_alias_families() -> None:
    result = CliRunner().invoke(cli, ["node-agent", "--help"])
    assert result.exit_code == 0
    assert "--serve-aliases" in result.output and "gpushare" in result.output


def test_a_bad_idle_time_is_refused_at_start() -> None:
    for value in ("ten minutes", "0s"):
        result = CliRunner().invoke(cli, ["node-agent", "--idle-after", value])
        assert result.exit_code == 2, result.output
        assert "--idle-after" in result.output


def test_help_names_the_usage_monitor_options() -> None:
    result = CliRunner().invoke(cli, ["node-agent", "--help"])
    for option in ("--usage-monitor / --no-usage-monitor", "--usage-state-file", "--idle-after"):
        assert option in result.output
    assert "/run/gpupool/monitor/state.json" in result.output and "10m" in result.output
