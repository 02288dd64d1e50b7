"""Cost of placing a remote-share pod (docs/remote-gpu.md, "Scheduling a remote share").

A cluster of ``--nodes`` nodes, every other one with ``--cards`` 16 GiB cards, 40 nodes per
switch. Timed with the core's scheduler (what the extender's filter and bind call), median of
``--rounds``: the filter over every node and the bind's choice for a node without GPUs, for a
remote-share pod asking 4,000 MiB and 30 percent, the same slice on two cards (``gpu-shared: 2``,
booked on two cards of one GPU node), and the one-card pod asking a local share.

    python3 bench/remote_placement.py [--nodes 5000 --cards 8 --rounds 100 --json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.core.model import ContainerRequest, GpuCard, GpuRequest, NodeSpec, PodRequest
from gpupool.core.policies import make_policy
from gpupool.core.remote_share import SWITCH_LABEL
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState

NODES_PER_SWITCH = 40


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.nodes, args.cards, args.rounds)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


def _median_ms(call: Callable[[], object], rounds: int) -> float:
    call()  # the shape caches are warm after the first call, as in a running extender
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 3)


def measure(count: int, cards: int, rounds: int) -> dict[str, float | int]:
    """Median milliseconds of each call; see the module docstring."""
    specs = [NodeSpec(name=f"n{i}", cpu_milli=64_000, memory_mib=256_000,
                      cards=tuple(GpuCard(index=j, uuid=f"GPU-{i}-{j}", model="A", memory_mib=16_384)
                                  for j in range(cards)) if i % 2 == 0 else (),
                      labels={SWITCH_LABEL: f"s{i // NODES_PER_SWITCH}"}) for i in range(count)]
    scheduler = Scheduler(ClusterState(specs), make_policy("binpack"))
    remote = PodRequest(key="ns/p", remote=True, containers=(ContainerRequest(
        "main", cpu_milli=1000, memory_mib=512, gpu=GpuRequest(memory_mib=4000, compute=300)),))
    local = dataclasses.replace(remote, remote=False)
    pair = dataclasses.replace(remote, key="ns/pair", containers=(dataclasses.replace(
        remote.containers[0], gpu=GpuRequest(count=2, memory_mib=4000, compute=300)),))
    rows = np.arange(count, dtype=np.int64)
    return {
        "nodes": count, "gpu_nodes": len(range(0, count, 2)), "cards_per_gpu_node": cards,
        "remote_filter_ms": _median_ms(lambda: scheduler.filter_and_score(remote, rows), rounds),
        "remote_bind_choice_ms": _median_ms(lambda: scheduler.assign(remote, "n1"), rounds),
        "two_card_remote_filter_ms": _median_ms(lambda: scheduler.filter_and_score(pair, rows), rounds),
        "two_card_remote_bind_choice_ms": _median_ms(lambda: scheduler.assign(pair, "n1"), rounds),
        "local_filter_ms": _median_ms(lambda: scheduler.filter_and_score(local, rows), rounds),
        "local_bind_choice_ms": _median_ms(lambda: scheduler.assign(local, "n0"), rounds),
    }


if __name__ == "__main__":
    main()
