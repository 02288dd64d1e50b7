"""Run ``gpupool extender FLAGS`` up to the point where it would start, and return its options."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpupool.cli import extender_cmd
from gpupool.cli.main import cli


def started_with(monkeypatch: pytest.MonkeyPatch, *flags: str) -> extender_cmd.ExtenderOptions:
    """The options ``gpupool extender`` would run with (the command must accept the flags)."""
    started: list[extender_cmd.ExtenderOptions] = []
    monkeypatch.setattr(extender_cmd, "run_extender", started.append)
    result = CliRunner().invoke(cli, ["extender", *flags])
    assert result.exit_code == 0, result.output
    (options,) = started
    return options
