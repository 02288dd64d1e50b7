"""Summaries of packing runs: medians over seeds, text tables and the JSON the CLI prints."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
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


def text_table(reports: Sequence[PolicyReport]) -> str:
    """One row per policy: median unallocated GPU % at each arrived-demand point."""
    head = f"{'policy':<12}" + "".join(f"{str(p) + '%':>9}" for p in REPORT_POINTS) + f"{'failed':>9}{'s/seed':>9}"
    lines = [f"trace: {reports[0].trace}" if reports else "", "unallocated GPU % (median over seeds) "
             "by arrived GPU demand", head, "-" * len(head)]
    for report in reports:
        failed = statistics.median(r.pods_failed for r in report.results)
        seconds = statistics.fmean(r.seconds for r in report.results)
        lines.append(f"{report.policy:<12}" + "".join(_cell(report.median_at(p)) for p in REPORT_POINTS)
                     + f"{failed:>9.0f}{seconds:>9.1f}")
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value:>9.2f}"


def plot(reports: Sequence[PolicyReport], path: str) -> None:
    """Unallocated GPU % against arrived demand, one median line per policy (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the install
        raise RuntimeError("--plot needs matplotlib: pip install 'gpupool[plot]'") from error
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for report in reports:
        xs = sorted(set.intersection(*(set(r.unallocated_pct) for r in report.results)))
        ys = [statistics.median(r.unallocated_pct[x] for r in report.results) for x in xs]
        axes.plot(xs, ys, label=report.policy)
    axes.set_xlabel("arrived GPU demand (% of capacity)")
    axes.set_ylabel("unallocated GPU (%)")
    axes.set_xlim(0, 130)
    axes.set_title(f"trace {reports[0].trace}" if reports else "")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
