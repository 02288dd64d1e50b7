"""``gpupool extender --filter-best-only``: on by default (the shipped scheduler configurations have
no prioritizeVerb and need it), ``--no-filter-best-only`` for the ``-prioritize.yaml`` variants, and
the choice reaches the service that answers filter."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpupool.cli import extender_cmd
from gpupool.cli.main import cli


@pytest.mark.parametrize(("flags", "best_only"), [
    pytest.param([], True, id="default"),
    pytest.param(["--filter-best-only"], True, id="on"),
    pytest.param(["--no-filter-best-only"], False, id="off"),
])
def test_the_flag_reaches_the_services_settings(monkeypatch: pytest.MonkeyPatch, flags: list[str],
                                               best_only: bool) -> None:
    started: list[extender_cmd.ExtenderOptions] = []
    monkeypatch.setattr(extender_cmd, "run_extender", started.append)
    result = CliRunner().invoke(cli, ["extender", *flags])
    assert result.exit_code == 0, result.output
    (options,) = started
    assert extender_cmd.service_settings(options).filter_best_only is best_only
    assert extender_cmd.service_settings(options).explain_limit == options.explain_limit
