"""The extender's cost of booking DRA claims in its ledger (docs/dra.md, "One ledger").

    python3 bench/dra_claim_bookings.py --nodes 5000 --claims 20000 --json

A ledger of ``--nodes`` nodes with 8 cards of 80 GB each (the extender's own cache, no API), then:
a first list of ``--claims`` allocated claims (each 4 GiB and 10 % of one card, spread over the
nodes) as the claims' list+watch delivers it; ``--events`` single claim events (a claim allocated,
then deleted), each timed alone under the cache lock as the watch applies it; a filter of one
extended-resource pod over every node before and after the claims are booked (the claims must
not make the filter slower: they are ordinary bookings). Prints a table and, with ``--json``, one
line with ``list_s``, ``event_p50_us``, ``event_p99_us``, ``filter_ms_before``, ``filter_ms_after``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.api.names import ResourceNames
from gpupool.extender.booking_keeper import ASSUMED_REFUSED
from gpupool.extender.cache import ClusterCache
from gpupool.extender.dra_watch import apply_claim_event, replace_claims
from gpupool.extender.service import ExtenderService, ExtenderSettings
from gpupool.kube.translate import pod_request
from gpupool.testing.kube_objects import container, node, pod

DRIVER = "gpu.gpupool.io"
CARDS = 8
CARD_MIB = 81920


def claim(i: int, nodes: int, name: str = "") -> dict[str, Any]:
    """Claim ``i``: 4 GiB and 10 % of card ``i mod 8`` of node ``i mod nodes``."""
    return {"metadata": {"namespace": f"ns{i % 50}", "name": name or f"c{i}", "uid": f"uid-{name or i}"},
            "status": {"allocation": {"devices": {"results": [{
                "request": "gpu", "driver": DRIVER, "pool": f"n{i % nodes}", "device": f"gpu-{(i // nodes) % CARDS}",
                "consumedCapacity": {"memory": "4Gi", "compute": "10"}}]}}}}


def filter_ms(service: ExtenderService, names: list[str], rounds: int = 5) -> float:
    request = pod_request(pod("probe", container(mib=4096)), ResourceNames())
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        passed = service.filter(request, names).passed
        times.append((time.perf_counter() - start) * 1000.0)
        assert len(passed) == len(names), len(passed)  # every node still has room: all were checked
        service.cache.unassume(request.key, ASSUMED_REFUSED)
    return statistics.median(times)


def run(nodes: int, claims: int, events: int) -> dict[str, float]:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node(f"n{i}", [CARD_MIB] * CARDS) for i in range(nodes)])
    cache.replace_pods([])
    names = [f"n{i}" for i in range(nodes)]
    service = ExtenderService(cache, None, settings=ExtenderSettings(filter_best_only=False))
    before = filter_ms(service, names)
    start = time.perf_counter()
    replace_claims(cache, [claim(i, nodes) for i in range(claims)])
    list_s = time.perf_counter() - start
    assert cache.claims.booked() == claims, cache.claims.booked()
    samples = []
    for i in range(events):
        obj = claim(claims + i, nodes, name=f"e{i}")
        for kind in ("ADDED", "DELETED"):
            start = time.perf_counter()
            apply_claim_event(cache, kind, obj)
            samples.append((time.perf_counter() - start) * 1e6)
    after = filter_ms(service, names)
    ordered = sorted(samples)
    return {"nodes": nodes, "claims": claims, "list_s": round(list_s, 3),
            "event_p50_us": round(ordered[len(ordered) // 2], 1),
            "event_p99_us": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
            "filter_ms_before": round(before, 2), "filter_ms_after": round(after, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims", type=int, default=20000)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    result = run(args.nodes, args.claims, args.events)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:>18}  {value}")


if __name__ == "__main__":
    main()
