"""``--creator-subjects-webhook`` makes the filter trust a group label the webhook checked, so it is
refused without the webhook's port (the extender would trust a check nobody makes)."""

from __future__ import annotations

from click.testing import CliRunner

from gpupool.cli.main import cli


def test_creator_subjects_without_the_admission_port_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["extender", "--creator-subjects-webhook"])
    assert result.exit_code == 2 and "--creator-subjects-webhook needs --admission-port" in result.output
