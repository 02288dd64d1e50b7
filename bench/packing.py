"""Packing quality: every bundled trace x every policy x seeds, beside the paper's reference numbers.

Usage: ``python bench/packing.py [--seeds 42-51] [--traces default,...] [--policies fgd,gpupool] [--jobs N]``.
``--traces`` takes bundled names, generated CPU-share variants (``cpu200``, ``cpu250@3``) and paths.
Prints one table: mean unallocated GPU % at 100 % arrived demand (the paper's bar charts use the
mean over seeds), with the paper's value in brackets where it published one, and the mean seconds
per seed. Not a test: numbers depend on the machine and take minutes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.cli.simulate_cmd import parse_seeds
from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.policies import POLICIES
from gpupool.sim.packing import SeedResult, run_seed
from gpupool.sim.trace import BUNDLED_TRACES, load_nodes, resolve_nodes
from gpupool.sim.variants import load_trace

PAPER = {  # unallocated GPU % at 100 % arrived, mean over seeds 42..51 (see data/openb/ATTRIBUTION.md)
    "default": {"random": 13.70, "dotprod": 9.38, "clustering": 8.35, "packing": 8.22, "bestfit": 7.14, "fgd": 4.77},
    "gpushare40": {"random": 15.14, "dotprod": 10.70, "clustering": 10.24, "packing": 10.23, "bestfit": 8.56,
                   "fgd": 6.04},
    "multigpu20": {"random": 13.08, "dotprod": 8.15, "clustering": 6.66, "packing": 6.50, "bestfit": 6.27,
                   "fgd": 4.47},
    "gpuspec10": {"random": 13.74, "dotprod": 9.83, "clustering": 8.04, "packing": 7.76, "bestfit": 6.90,
                  "fgd": 5.34},
    "cpu050": {"random": 10.98, "dotprod": 6.97, "clustering": 6.48, "packing": 6.54, "bestfit": 6.44, "fgd": 5.00},
    # The paper's own cpu200/cpu250 files; gpupool generates these names by the same method
    # (gpupool/sim/variants.py), so the bracket compares against a different draw of the same recipe.
    "cpu200": {"fgd": 5.18},
    "cpu250": {"fgd": 6.80},
}


def _run(args: tuple[str, str, int]) -> tuple[str, str, SeedResult]:
    trace, policy, seed = args
    nodes = load_nodes(resolve_nodes("openb"))
    pods = [p.request for p in load_trace(trace)]
    return trace, policy, run_seed(nodes, pods, policy, seed, WorkloadProfile.from_pods(pods))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--traces", default=",".join(BUNDLED_TRACES))
    parser.add_argument("--policies", default=",".join(sorted(POLICIES)))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--per-seed", action="store_true",
                        help="also print every seed's value, one line per trace and policy")
    args = parser.parse_args()
    traces = args.traces.split(",")
    policies = args.policies.split(",")
    tasks = [(t, p, s) for t in traces for p in policies for s in parse_seeds(args.seeds)]
    started = time.perf_counter()
    results: dict[tuple[str, str], list[SeedResult]] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for done, (trace, policy, result) in enumerate(pool.map(_run, tasks), start=1):
            results.setdefault((trace, policy), []).append(result)
            print(f"\r{done}/{len(tasks)} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    width = 17
    print(f"unallocated GPU % at 100% arrived, mean over seeds {args.seeds} [paper]; "
          f"{time.perf_counter() - started:.0f} s in all")
    print(f"{'policy':<12}" + "".join(f"{t:>{width}}" for t in traces) + f"{'s/seed':>9}")
    for policy in policies:
        cells = []
        seconds: list[float] = []
        for trace in traces:
            runs = results[(trace, policy)]
            seconds += [r.seconds for r in runs]
            mean = statistics.fmean(r.unallocated_pct[100] for r in runs)
            paper = PAPER.get(trace.split("@")[0], {}).get(policy)
            cells.append(f"{mean:6.2f} [{paper:5.2f}]" if paper is not None else f"{mean:6.2f}        ")
        print(f"{policy:<12}" + "".join(f"{c:>{width}}" for c in cells) + f"{statistics.fmean(seconds):>9.1f}")
    if args.per_seed:
        for (trace, policy), runs in results.items():
            values = " ".join(f"{r.seed}:{r.unallocated_pct[100]:.2f}" for r in sorted(runs, key=lambda r: r.seed))
            print(f"per-seed {trace} {policy} {values}")


if __name__ == "__main__":
    main()
