"""Did a change to the simulator's hot path move any placement? Hashes of every decision of a few replays.

Usage: ``python bench/sim_placements.py [--jobs N] [--check docs/results/placements.txt]``.
Replays the packing experiment (:func:`gpupool.sim.packing.run_seed`) for the trace / policy / seed
combinations below, which cover slices, whole and multi-card pods, model-restricted pods, CPU-only
pods and the three fragmentation-aware and best-fit policies, and prints per replay the pods, the
failures and a SHA-256 of every pod's decision in arrival order: the node and the cards (with the
compute and memory of every slice) or the failure reason. Speed work must leave every line as it
was; ``--check FILE`` compares with a stored run and exits 1 on any difference.

The hashes depend on floating-point results (the fragmentation measure's matrix products), so they
are a reference for one machine's numpy and BLAS; a line that differs elsewhere says "look", not
"wrong": ``bench/packing.py`` tells whether the results moved.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import Placement, PodRequest
from gpupool.core.scheduler import Unschedulable
from gpupool.sim.packing import run_seed
from gpupool.sim.trace import load_nodes, resolve_nodes
from gpupool.sim.variants import load_trace

REPLAYS = (
    ("default", "gpupool", 42),
    ("default", "fgd", 42),
    ("cpu250", "gpupool", 42),
    ("gpuspec10", "gpupool", 43),
    ("multigpu20", "gpupool", 44),
    ("gpushare40", "gpupool", 45),
    ("default", "bestfit", 46),
    ("cpu050", "gpupool", 47),
)
"""(trace, policy, seed) replayed; the set docs/simulator.md ("Speed") names."""


def decision_text(decision: Placement | Unschedulable) -> str:
    """One decision as the hash sees it: where and which card shares, or why not."""
    if isinstance(decision, Unschedulable):
        return f"-{decision.reason}"
    cards = ";".join(
        f"{a.container}{'/init' if a.init else ''}:" + ",".join(
            f"{s.card}:{s.compute}:{s.memory_mib}:{int(s.exclusive)}" for s in a.slices)
        for a in decision.containers)
    return f"{decision.node}|{cards}"


def replay(case: tuple[str, str, int]) -> str:
    """The report line of one replay: trace, policy, seed, pods, failures, decisions' hash."""
    trace, policy, seed = case
    nodes = load_nodes(resolve_nodes("openb"))
    pods = [p.request for p in load_trace(trace)]
    digest = hashlib.sha256()

    def note(pod: PodRequest, decision: Placement | Unschedulable) -> None:
        digest.update(f"{pod.key}={decision_text(decision)}\n".encode())

    result = run_seed(nodes, pods, policy, seed, WorkloadProfile.from_pods(pods), on_decision=note)
    return (f"{trace} {policy} {seed} pods={result.pods_total} failed={result.pods_failed} "
            f"unallocated100={result.unallocated_pct[100]:.4f} sha256={digest.hexdigest()[:16]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--check", type=Path, help="a stored output to compare with (exit 1 on a difference)")
    args = parser.parse_args()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        lines = list(pool.map(replay, REPLAYS))
    for line in lines:
        print(line)
    if args.check is not None:
        expected = args.check.read_text().split("\n")
        moved = [line for line in lines if line not in expected]
        if moved:
            print(f"{len(moved)} replay(s) differ from {args.check}", file=sys.stderr)
            sys.exit(1)
        print(f"all {len(lines)} replays as in {args.check}", file=sys.stderr)


if __name__ == "__main__":
    main()
