"""Cost of one pod event on the node agent's watch thread: the one decode and the feeds that read it.

Every event of the node's pod watch is decoded once into a ``NodePod``
(:func:`gpupool.nodeagent.node_pod.decode_node_pod`), then handed to the lending side's pods and the
container directory, which read the record instead of the raw pod. Timed, per event, over ``--pods``
pods of ``--containers`` containers, each holding two cards of an ``assignment-v1`` (the annotation's
decode is most of the cost): the decode alone, the two feeds alone, and both (what the watch thread
spends per event). The best of ``--rounds`` rounds, in microseconds. The feeds include the container
directory's update, which rebuilds its table per pod (it grows with the node's containers).

    python3 bench/pod_decode.py [--pods 200 --containers 3 --rounds 15 --json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpupool.api.annotations import Assignment, CardRef, ContainerCards, encode_assignment
from gpupool.api.lending import LendingNames
from gpupool.api.names import ResourceNames
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.containers.pod_containers import DirectoryFeed
from gpupool.nodeagent.lending.pods import LendingPods
from gpupool.nodeagent.node_pod import NodePod, decode_node_pod

NAMES = ResourceNames()
WHEN = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def gpu_pod(i: int, containers: int) -> dict[str, Any]:
    """A running pod of node ``node-a`` whose containers each hold slices of two cards."""
    cards = tuple(ContainerCards(f"c{k}", tuple(CardRef(c, f"GPU-{c}", 4096, 300) for c in (2 * k, 2 * k + 1)))
                  for k in range(containers))
    notes = {NAMES.assignment: encode_assignment(Assignment("node-a", WHEN, cards)), "example.com/note": "y" * 40}
    return {"metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"uid-{i}", "annotations": notes,
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "ownerReferences": [{"kind": "Job", "uid": "job-1", "controller": True}]},
            "spec": {"nodeName": "node-a", "priority": 1000, "containers": [
                {"name": f"c{k}", "resources": {"limits": {NAMES.gpu_mem: "4096", NAMES.gpu_core: "30"}}}
                for k in range(containers)]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": f"c{k}", "containerID": f"containerd://id-{i}-{k}"} for k in range(containers)]}}


def best_us(items: list[Any], work: Callable[[Any], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for item in items:
            work(item)
        best = min(best, (time.perf_counter() - start) / len(items))
    return round(best * 1e6, 1)


def measure(pods: int, containers: int, rounds: int) -> dict[str, float | int]:
    objs = [gpu_pod(i, containers) for i in range(pods)]
    lending, directory = LendingPods(LendingNames()), DirectoryFeed(InMemoryContainerDirectory())

    def feeds(pod: NodePod) -> None:
        lending.on_event("MODIFIED", pod)
        directory.on_event("MODIFIED", pod)

    def event(obj: dict[str, Any]) -> None:
        pod = decode_node_pod(obj, NAMES)
        assert pod is not None
        feeds(pod)

    records = [decode_node_pod(obj, NAMES) for obj in objs]
    return {"pods": pods, "containers": containers,
            "decode_us": best_us(objs, lambda obj: decode_node_pod(obj, NAMES), rounds),
            "feeds_us": best_us(records, feeds, rounds),
            "per_event_us": best_us(objs, event, rounds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--containers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.pods, args.containers, args.rounds)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
