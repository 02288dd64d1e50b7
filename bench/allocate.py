"""Allocate latency with N pods arriving at once on one node (fake kubelet, real gRPC).

    python3 bench/allocate.py --pods 100 --json

Prints a table and, with ``--json``, one line ``{"allocate_p99_ms": ...}``. The latency is what the
fake kubelet measures around each Allocate RPC (PodResources List + mapping + grant), i.e. what
kubelet's admission waits for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.testing.node_harness import fake_pod, running_node
from gpupool.testing.node_workload import generate


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(pods: int, cards: int, seed: int) -> dict[str, float]:
    gpu_file, workload = generate(pods, cards=cards, seed=seed)
    async with running_node(gpu_file, [p.json for p in workload], seed=seed) as node:
        start = time.perf_counter()
        await node.kubelet.handle_pod_additions([fake_pod(p.json) for p in workload])
        await node.kubelet.wait_idle(120)
        wall = time.perf_counter() - start
        ms = node.agent.stats.allocate_ms
        return {"pods": pods, "allocate_calls": len(ms), "allocate_p50_ms": statistics.median(ms),
                "allocate_p99_ms": percentile(ms, 0.99), "allocate_max_ms": max(ms),
                "admission_wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--cards", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args.pods, args.cards, args.seed))
    print(f"{'metric':<20} {'value':>10}")
    for key, value in result.items():
        print(f"{key:<20} {value:>10.2f}")
    if args.json:
        print(json.dumps({k: round(v, 3) for k, v in result.items()}))


if __name__ == "__main__":
    main()
