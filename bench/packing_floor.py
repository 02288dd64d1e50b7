"""How well could a scheduler pack a trace? An offline packing reference for unallocated GPU %.

Usage: ``python bench/packing_floor.py [--traces default,...] [--seeds 42-51]``.

At 100 % arrived demand the unallocated GPU share equals the failed demand. If every sub-card pod
is placed, the cards holding them carry at least the waste of the best *offline* bin packing of
those slices (cards of 1000 milli), and whole-card pods have exactly the remaining cards. The
cutting-stock LP relaxation (column generation with a bounded-knapsack pricing step) gives a lower
bound on that packing's card count, hence on the waste. It ignores CPU, memory and GPU models, so
it is optimistic for such a scheduler. It bounds only a scheduler that places *every* slice that
arrived: one that fails some pods (near 100 % every scheduler does) leaves no hole for them, and can
end below it (gpupool does on gpushare40). Read it as a yardstick for how much packing waste is
left. Seeds and arrival order are the simulator's (``gpupool.sim.packing.workload``).
Needs scipy (HiGHS LP solver; in the ``dev`` extra).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from scipy.optimize import linprog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.cli.simulate_cmd import parse_seeds
from gpupool.core.fragmentation import shape_of
from gpupool.core.state import ClusterState
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.sim.packing import workload
from gpupool.sim.trace import BUNDLED_TRACES, load_nodes, load_pods, resolve_nodes, resolve_trace

STEP = 10
"""Trace slices are multiples of 10 milli, so the knapsack works in steps of 10."""


def cards_lower_bound(counts: Counter[int], capacity: int = COMPUTE_PER_CARD) -> float:
    """LP lower bound on the cards needed to hold ``counts[size]`` slices of each size."""
    sizes = sorted(counts)
    demand = np.array([counts[s] for s in sizes], dtype=float)
    columns = [np.eye(len(sizes))[i] * min(capacity // s, counts[s]) for i, s in enumerate(sizes)]
    while True:
        matrix = np.array(columns).T
        lp = linprog(np.ones(len(columns)), A_ub=-matrix, b_ub=-demand, bounds=(0, None), method="highs")
        duals = -lp.ineqlin.marginals
        value, pattern = _best_pattern(sizes, counts, duals, capacity)
        if value <= 1 + 1e-9:  # no card pattern is worth more than the card it costs
            return float(lp.fun)
        columns.append(pattern)


def _best_pattern(sizes: list[int], counts: Counter[int], duals: np.ndarray, capacity: int) -> tuple[float, np.ndarray]:
    """Bounded knapsack: the card filling with the largest total dual value."""
    units = capacity // STEP
    best = np.zeros(units + 1)
    chosen: list[dict[int, int]] = [{} for _ in range(units + 1)]
    for i, size in enumerate(sizes):
        weight = size // STEP
        for _copy in range(min(capacity // size, counts[size])):
            for c in range(units, weight - 1, -1):
                if best[c - weight] + duals[i] > best[c] + 1e-12:
                    best[c] = best[c - weight] + duals[i]
                    chosen[c] = {**chosen[c - weight], i: chosen[c - weight].get(i, 0) + 1}
    pattern = np.zeros(len(sizes))
    for i, k in chosen[units].items():
        pattern[i] = k
    return float(best[units]), pattern


def floor_pct(trace: str, seed: int) -> float:
    """The LP's waste as a percentage of the cluster's GPUs for one seed's arrivals up to 100 %."""
    state = ClusterState(load_nodes(resolve_nodes("openb")))
    capacity = state.total_compute()
    pods = [p.request for p in load_pods(resolve_trace(trace))]
    slices: Counter[int] = Counter()
    arrived = 0
    for pod in workload(pods, seed, capacity):
        arrived += pod.gpu_milli_total()
        if arrived > capacity:
            break
        _cpu, milli, count, _models = shape_of(pod)
        if count == 1 and 0 < milli < COMPUTE_PER_CARD:
            slices[milli] += 1
    if not slices:
        return 0.0
    waste = cards_lower_bound(slices) * COMPUTE_PER_CARD - sum(size * n for size, n in slices.items())
    return 100.0 * waste / capacity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--traces", default=",".join(BUNDLED_TRACES))
    args = parser.parse_args()
    print(f"offline packing floor: unallocated GPU % at 100 % arrived (LP bound), seeds {args.seeds}")
    print(f"{'trace':<12}{'mean':>8}{'min':>8}{'max':>8}")
    for trace in args.traces.split(","):
        values = [floor_pct(trace, seed) for seed in parse_seeds(args.seeds)]
        print(f"{trace:<12}{statistics.fmean(values):>8.2f}{min(values):>8.2f}{max(values):>8.2f}")


if __name__ == "__main__":
    main()
