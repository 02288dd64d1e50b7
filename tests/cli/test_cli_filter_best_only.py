"""``gpupool extender --filter-best-only``: on by default (the shipped scheduler configurations have
no prioritizeVerb and need it), ``--no-filter-best-only`` for the ``-prioritize.yaml`` variants;
``--filter-one-best`` (default) or ``--filter-all-best`` among the best nodes; and the choices reach
the service that answers filter."""

from __future__ import annotations

import pytest

from gpupool.cli import extender_cmd
from gpupool.extender.service import ExtenderSettings
from tests.cli.extender_start import started_with


@pytest.mark.parametrize(("flags", "best_only"), [
    pytest.param([], True, id="default"),
    pytest.param(["--filter-best-only"], True, id="on"),
    pytest.param(["--no-filter-best-only"], False, id="off"),
])
def test_the_flag_reaches_the_services_settings(monkeypatch: pytest.MonkeyPatch, flags: list[str],
                                               best_only: bool) -> None:
    options = started_with(monkeypatch, *flags)
    assert extender_cmd.service_settings(options).filter_best_only is best_only
    assert extender_cmd.service_settings(options).explain_limit == options.explain_limit


@pytest.mark.parametrize(("flags", "one_best"), [
    pytest.param([], True, id="default"),
    pytest.param(["--filter-one-best"], True, id="one-best"),
    pytest.param(["--filter-all-best"], False, id="all-best"),
    pytest.param(["--no-filter-best-only", "--filter-one-best"], True, id="kept-beside-no-best-only"),
])
def test_the_one_best_flag_reaches_the_services_settings(monkeypatch: pytest.MonkeyPatch, flags: list[str],
                                                         one_best: bool) -> None:
    """``--filter-one-best`` (the default) narrows the best nodes to one; ``--filter-all-best`` passes them all."""
    options = started_with(monkeypatch, *flags)
    settings = extender_cmd.service_settings(options)
    assert options.filter_one_best is one_best and settings.filter_one_best is one_best
    assert settings.filter_best_only is ("--no-filter-best-only" not in flags)


def test_the_cli_without_flags_runs_the_librarys_default_extender(monkeypatch: pytest.MonkeyPatch) -> None:
    """One source for each default: ``ExtenderSettings()`` (what tests build) is what ``gpupool
    extender`` runs without flags, and ``ExtenderOptions()`` (what bench/ and tests start) too."""
    assert extender_cmd.service_settings(started_with(monkeypatch)) == ExtenderSettings()
    assert extender_cmd.service_settings(extender_cmd.ExtenderOptions()) == ExtenderSettings()


@pytest.mark.parametrize(("flags", "seconds"), [
    pytest.param([], ExtenderSettings().assume_s, id="default"),
    pytest.param(["--assume-deadline", "30"], 30.0, id="set"),
])
def test_the_assume_deadline_reaches_the_services_settings(monkeypatch: pytest.MonkeyPatch, flags: list[str],
                                                           seconds: float) -> None:
    """How long a filter's assumption waits for its bind (docs/extender.md, "Assumed bookings")."""
    assert extender_cmd.service_settings(started_with(monkeypatch, *flags)).assume_s == seconds
