"""What the FGD paper published for the bundled traces, so a replay can be read against it.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent", USENIX ATC 2023: mean unallocated GPU % at 100 % arrived GPU demand over seeds 42-51, on
the openb cluster. Only the values the paper states for a trace are listed; the rest are unknown
rather than guessed.
"""

from __future__ import annotations

from collections.abc import Mapping

PAPER = "Weng et al., ATC 2023"

PUBLISHED_UNALLOCATED_PCT: Mapping[str, Mapping[str, float]] = {
    "default": {"fgd": 4.77, "bestfit": 7.14},
    "gpushare40": {"fgd": 6.04},
    "multigpu20": {"fgd": 4.47},
    "gpuspec10": {"fgd": 5.34},
    "cpu050": {"fgd": 5.00},
    "cpu200": {"fgd": 5.18},
    "cpu250": {"fgd": 6.80},
}
"""Per trace, per policy: the paper's mean unallocated GPU % at 100 % arrived."""


def context_lines(trace: str, cluster_gpus: int) -> list[str]:
    """Lines that put a report in context: the paper's numbers on this trace (when it has them) and
    what one point of unallocated GPU means in cards of this cluster."""
    lines = []
    published = PUBLISHED_UNALLOCATED_PCT.get(trace)
    if published:
        shown = ", ".join(f"{policy} {value:.2f}" for policy, value in published.items())
        lines.append(f"published at 100% arrived ({PAPER}, mean of seeds 42-51): {shown}")
    if cluster_gpus > 0:
        point = cluster_gpus / 100
        shown_point = f"{point:.0f}" if point >= 10 else f"{point:.2g}"
        lines.append(f"one point of unallocated GPU is {shown_point} GPUs of this cluster's {cluster_gpus:,}")
    return lines
