"""``gpupool extender --bind-deadline``: reaches the extender's options, and nonsense is refused."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpupool.cli.main import cli
from gpupool.extender.binder import DEFAULT_DEADLINE_S
from tests.cli.extender_start import started_with


@pytest.mark.parametrize(
    ("flags", "deadline_s"),
    [pytest.param([], DEFAULT_DEADLINE_S, id="default"), pytest.param(["--bind-deadline", "3.5"], 3.5, id="given")],
)
def test_the_bind_deadline_reaches_the_options(monkeypatch: pytest.MonkeyPatch, flags: list[str],
                                               deadline_s: float) -> None:
    assert started_with(monkeypatch, *flags).bind_deadline_s == deadline_s


@pytest.mark.parametrize("value", [pytest.param("0", id="zero"), pytest.param("-1", id="negative")])
def test_a_bind_deadline_that_leaves_no_time_is_refused(value: str) -> None:
    result = CliRunner().invoke(cli, ["extender", "--bind-deadline", value])
    assert result.exit_code == 2 and "--bind-deadline" in result.output
