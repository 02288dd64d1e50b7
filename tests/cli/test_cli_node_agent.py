"""``gpupool node-agent`` flags that fail before anything starts."""

from __future__ import annotations

from click.testing import CliRunner

from gpupool.cli.main import cli


def test_unknown_alias_family_is_refused_at_start() -> None:
    """A typo in a DaemonSet's --serve-aliases must stop the agent, not silently serve nothing."""
    result = CliRunner().invoke(cli, ["node-agent", "--serve-aliases", "gpushare,hami"])
    assert result.exit_code == 2
    assert "unknown alias family 'hami'" in result.output and "gpumanager" in result.output


def test_help_names_the_alias_families() -> None:
    result = CliRunner().invoke(cli, ["node-agent", "--help"])
    assert result.exit_code == 0
    assert "--serve-aliases" in result.output and "gpushare" in result.output
