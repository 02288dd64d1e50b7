"""Summaries of packing runs: medians over seeds, text tables and the JSON the CLI prints."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.sim.packing import REPORT_POINTS, SeedResult


@dataclass(frozen=True)
class PolicyReport:
    """All seeds of one policy on one trace."""

    policy: str
    trace: str
    results: tuple[SeedResult, ...]

    def _values_at(self, point: int) -> list[float] | None:
        """Every seed's value at ``point``, or None when a seed's demand never reached it."""
        values = [r.unallocated_pct.get(point) for r in self.results]
        return None if any(v is None for v in values) else [v for v in values if v is not None]

    def median_at(self, point: int) -> float | None:
        values = self._values_at(point)
        return None if values is None else round(statistics.median(values), 3)

    def mean_at(self, point: int) -> float | None:
        values = self._values_at(point)
        return None if values is None else round(statistics.fmean(values), 3)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "trace": self.trace,
            "seeds": [r.seed for r in self.results],
            "unallocated_pct_at": {str(p): self.median_at(p) for p in REPORT_POINTS},
            "unallocated_pct_mean_at": {str(p): self.mean_at(p) for p in REPORT_POINTS},
            "per_seed": {
                str(r.seed): {
                    "unallocated_pct_at": {str(p): r.unallocated_pct.get(p) for p in REPORT_POINTS},
                    "fragmentation_pct_at": {str(p): r.fragmentation_pct.get(p) for p in REPORT_POINTS},
                    "pods": r.pods_total,
                    "failed_pods": r.pods_failed,
                    "seconds": r.seconds,
                }
                for r in self.results
            },
        }


COLUMN_LEGEND = (
    "90%..130%: GPUs left unallocated, in % of the cluster's GPUs, once pods asking for that % of them have",
    "           arrived (median over seeds; lower is better). Below 100 % part of it was never asked for",
    "           (at 90 %, at least 10); the rest is stranded in pieces no pod fits. '-': never reached.",
    "failed:    pods placed on no node (median per seed; demand goes on to 130 %, so many fail)",
    "s/seed:    seconds one seed's replay took",
)
"""What the table's columns mean, printed under it (the packing experiment's terms are not obvious)."""


def text_table(reports: Sequence[PolicyReport]) -> str:
    """One row per policy: median unallocated GPU % at each arrived-demand point, then the legend."""
    head = f"{'policy':<12}" + "".join(f"{str(p) + '%':>9}" for p in REPORT_POINTS) + f"{'failed':>9}{'s/seed':>9}"
    lines = [f"trace: {reports[0].trace}" if reports else "", "unallocated GPU % (median over seeds) "
             "by arrived GPU demand", head, "-" * len(head)]
    for report in reports:
        failed = statistics.median(r.pods_failed for r in report.results)
        seconds = statistics.fmean(r.seconds for r in report.results)
        lines.append(f"{report.policy:<12}" + "".join(_cell(report.median_at(p)) for p in REPORT_POINTS)
                     + f"{failed:>9.0f}{seconds:>9.1f}")
    lines.append("")
    lines.extend(f"  {entry}" for entry in COLUMN_LEGEND)
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value:>9.2f}"


@dataclass(frozen=True)
class PlotWindow:
    """The part of the arrived-demand / unallocated plane a plot shows."""

    x_low: int
    x_high: int
    y_high: float


def median_curve(report: PolicyReport) -> dict[int, float]:
    """Median over seeds of the unallocated GPU % at every arrived-demand % all seeds reached."""
    xs = sorted(set.intersection(*(set(r.unallocated_pct) for r in report.results))) if report.results else []
    return {x: statistics.median(r.unallocated_pct[x] for r in report.results) for x in xs}


def plot_window(curves: Sequence[Mapping[int, float]]) -> PlotWindow:
    """Where the curves say something: from just before they leave the diagonal to their end.

    Until the cluster fills, every policy places every pod that arrives, so each curve is the
    diagonal ``100 - x`` and all of them coincide; on the full 0-130 range that shared line takes
    most of the figure and the policies' differences (a few points near 100 %) are a few pixels.
    The window's height is what the curves leave unallocated from 95 % arrived on (with room above),
    and it starts where the diagonal enters that height, so every difference between policies past
    that point is drawn at full scale.
    """
    tail = [u for curve in curves for x, u in curve.items() if x >= STRANDED_FROM]
    ends = [max(curve) for curve in curves if curve]
    x_high = max(ends, default=130)
    y_high = max(1.0, round(max(tail, default=10.0) * 1.15 + 0.5, 1))
    x_low = max(0, int((100 - y_high) // 5 * 5) - 5)
    return PlotWindow(x_low=min(x_low, STRANDED_FROM - 10), x_high=max(x_high, x_low + 10), y_high=y_high)


STRANDED_FROM = 95
"""Arrived demand % from which what is unallocated is mostly stranded, not yet asked for."""


def require_plotting() -> None:
    """Fail at once, before any simulating, when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise PlottingUnavailable("--plot needs matplotlib: pip install 'gpupool[plot]' "
                                  "(or python3 -m pip install matplotlib)") from error


class PlottingUnavailable(RuntimeError):
    """``--plot`` was asked for and matplotlib is not installed."""


def plot(reports: Sequence[PolicyReport], path: str) -> PlotWindow:
    """Unallocated GPU % against arrived demand, one median line per policy, in the window where the
    policies differ (:func:`plot_window`); returns that window. Needs matplotlib."""
    require_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [median_curve(report) for report in reports]
    window = plot_window(curves)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for report, curve in zip(reports, curves, strict=True):
        xs = [x for x in curve if x >= window.x_low]
        axes.plot(xs, [curve[x] for x in xs], label=report.policy)
    axes.axvline(100, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xlabel("arrived GPU demand (% of the cluster's GPUs)")
    axes.set_ylabel("unallocated GPU (% of the cluster's GPUs)")
    axes.set_xlim(window.x_low, window.x_high)
    axes.set_ylim(0, window.y_high)
    trace = f"trace {reports[0].trace}, " if reports else ""
    axes.set_title(f"{trace}from {window.x_low} % arrived (below it every pod that arrives is placed)"
                   if all(_on_diagonal(c, window.x_low) for c in curves) else f"{trace}from {window.x_low} % arrived",
                   fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return window


def _on_diagonal(curve: Mapping[int, float], below: int, tolerance: float = 0.5) -> bool:
    """Whether the curve is ``100 - x`` (nothing stranded) at every point before ``below``."""
    return all(abs(u - max(0.0, 100.0 - x)) <= tolerance for x, u in curve.items() if x < below)
