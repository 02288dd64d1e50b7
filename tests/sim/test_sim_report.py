"""The packing report's plot: it shows where the policies differ, not the diagonal they share."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.sim.packing import SeedResult
from gpupool.sim.report import PolicyReport, median_curve, plot, plot_window


def curve(stranded_from: int, stranded_at_130: float) -> dict[int, float]:
    """Unallocated % of a policy that places everything up to ``stranded_from`` % arrived and then
    strands a growing share, ``stranded_at_130`` points at the end."""
    out: dict[int, float] = {}
    for x in range(131):
        ideal = max(0.0, 100.0 - x)
        share = (x - stranded_from) / (130 - stranded_from) if x >= stranded_from and stranded_at_130 else 0.0
        excess = stranded_at_130 * share
        out[x] = round(ideal + excess, 3)
    return out


def report(policy: str, *curves: dict[int, float]) -> PolicyReport:
    return PolicyReport(policy, "t", tuple(SeedResult(seed=i, unallocated_pct=c, fragmentation_pct={},
                                                      pods_total=1, pods_failed=0) for i, c in enumerate(curves)))


def test_the_window_starts_where_the_curves_leave_the_shared_diagonal() -> None:
    window = plot_window([curve(88, 4.0), curve(90, 6.0)])
    assert window.x_high == 130
    # the tail past 95 % is at most ~6.9 points: the window is that tall, not 100
    assert 6.0 < window.y_high < 10.0
    assert 80 <= window.x_low <= 90
    # the diagonal every policy shares (x < 88) takes at most a sixth of the shown width
    assert (88 - window.x_low) / (window.x_high - window.x_low) < 1 / 6


def test_a_policy_that_strands_early_widens_the_window() -> None:
    window = plot_window([curve(60, 30.0), curve(90, 4.0)])
    assert window.y_high > 30 and window.x_low <= 70


def test_the_window_always_shows_the_tables_columns() -> None:
    window = plot_window([curve(130, 0.0)])  # a perfect packer: nothing stranded anywhere
    assert window.x_low <= 85 and window.y_high >= 1.0


def test_median_curve_keeps_points_every_seed_reached() -> None:
    short = {x: 100.0 - x for x in range(101)}
    assert max(median_curve(report("p", curve(90, 4.0), short))) == 100


@pytest.mark.slow
def test_the_plot_is_drawn_in_the_window(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "curves.png"
    window = plot([report("fgd", curve(88, 5.0)), report("gpupool", curve(92, 3.0))], str(png))
    assert window == plot_window([curve(88, 5.0), curve(92, 3.0)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
