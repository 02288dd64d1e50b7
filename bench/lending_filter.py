"""Cost of a borrower's filter: owned capacity first, then the loans, then the earliest-request rule.

A cluster of ``--nodes`` one-card nodes, each card held whole by its owner; ``--lending`` of them
lend 12,000 MiB; ``--waiting`` older low-priority pods (13,000 MiB: they fit no loan) have been
filtered before and wait. Timed: the filter of a younger low-priority pod asking 8,000 MiB over
every node (what kube-scheduler sends), and of a high-priority pod that may not borrow. The filter
passes every node that fits (``--no-filter-best-only``, not the shipped mode), so that
``borrower_passed`` counts the lending nodes the rules let it borrow on.

    python3 bench/lending_filter.py [--nodes 5000 --lending 100 --waiting 64 --json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.extender.service import ExtenderSettings
from gpupool.kube.translate import pod_request
from gpupool.testing.kube_objects import node, placed_pod
from gpupool.testing.lending_world import CARD, lendable, lending_node, lending_world, waiting

ROUNDS = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--lending", type=int, default=100)
    parser.add_argument("--waiting", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.nodes, args.lending, args.waiting)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


def measure(count: int, lending: int, older_count: int, rounds: int = ROUNDS) -> dict[str, float | int]:
    """The medians (ms) and nodes passed of both filters; see the module docstring."""
    # n1 is lending_world's own lending node, its card held by its owner
    nodes = [lending_node(f"n{i}", lendable((0, 12000), uuid_node=f"n{i}")) if i <= lending
             else node(f"n{i}", [CARD]) for i in range(2, count + 1)]
    owners = [placed_pod(f"own{i}", f"n{i}", 0, CARD) for i in range(2, count + 1)]
    older = [waiting(f"old{i}", 13000, age_s=i) for i in range(older_count)]
    every_fit = ExtenderSettings(filter_best_only=False)
    _, cache, service = lending_world(*owners, *older, nodes=[lending_node(), *nodes], settings=every_fit)
    names = [f"n{i}" for i in range(1, count + 1)]
    for raw in older:
        service.filter(pod_request(raw, cache.names), names)
    me = waiting("me", 8000, age_s=10_000)
    cache.upsert_pod(me)
    result: dict[str, float | int] = {"nodes": len(names), "lending": lending, "waiting": older_count}
    for label, raw in (("borrower", me), ("high_priority", waiting("hi", 8000, priority=5000))):
        request = pod_request(raw, cache.names)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            outcome = service.filter(request, names)
            times.append(time.perf_counter() - start)
        result[f"{label}_filter_median_ms"] = round(statistics.median(times) * 1e3, 2)
        result[f"{label}_passed"] = len(outcome.passed)
    return result


if __name__ == "__main__":
    main()
