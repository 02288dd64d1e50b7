"""Cost of the extender's nesting check on request bodies, beside orjson's parse of the same body.

Every body the extender's verbs and admission webhooks read is first measured for nesting depth
(:func:`gpupool.extender.http.body.nests_deeper_than`), then parsed. Timed here: kube-scheduler
shaped bodies (the latency benchmark's filter of 5,000 names; a filter whose pod holds 160 objects,
as managedFields do; 10,000 names of 253 characters; a preempt of 1,000 nodes x 110 victims) and
hostile 16 MB ones, which are only checked (the deep one would crash orjson before 3.9.15). Medians
of ``--repeats`` repeats, in milliseconds; docs/extender.md ("Limits and errors") quotes them.

    python3 bench/json_nesting.py [--repeats 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

from bench.extender_cluster import SHAPES, pod_json
from gpupool.extender.http.body import MAX_NESTING, nests_deeper_than

MB = 1_000_000


def bodies() -> dict[str, bytes]:
    plain = pod_json("p", {"gpupool.io/gpu-mem": "32"})  # a GPU pod as kube-scheduler sends it
    managed: dict[str, Any] = dict(plain, metadata=dict(plain["metadata"], managedFields=[{"fieldsV1": {
        f"f:k{i}": {"f:a": {}, "f:b": {"f:c": {}}} for i in range(40)}}]))
    names = [f"node-{i:05d}" for i in range(5000)]
    victims = {f"node-{i}": {"Pods": [{"UID": f"uid-{i}-{j}-0000-0000-000000000000"} for j in range(110)],
                             "NumPDBViolations": 0} for i in range(1000)}
    return {
        "filter, benchmark pod, 5,000 names": orjson.dumps({"Pod": pod_json("bench-1", SHAPES[0]), "NodeNames": names}),
        "filter, pod with 160 objects, 5,000 names": orjson.dumps({"Pod": managed, "NodeNames": names}),
        "filter, pod with 160 objects, 10,000 names of 253 characters": orjson.dumps(
            {"Pod": managed, "NodeNames": [f"n{i:05d}" + "x" * 247 for i in range(10_000)]}),
        "preempt, 1,000 nodes x 110 victims": orjson.dumps({"Pod": plain, "NodeNameToMetaVictims": victims}),
        "hostile: 8M [ then 8M ]": b"[" * 8_000_000 + b"]" * 8_000_000,
        "hostile: 125,000 nests 64 deep": (b"[" * 64 + b"]" * 64) * 125_000,
        "hostile: 4M strings holding [": b"[" * 64 + b'"[",' * 4_000_000 + b"1" + b"]" * 64,
    }


def median_ms(call: Callable[[], object], size: int, repeats: int) -> float:
    number = 3 if size > MB else 300
    return statistics.median(timeit.repeat(call, number=number, repeat=repeats)) / number * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="one JSON line: per body, its size and both times")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    for name, raw in bodies().items():
        row: dict[str, Any] = {
            "mb": round(len(raw) / MB, 2), "brackets": raw.count(b"[") + raw.count(b"{"),
            "deeper_than_bound": nests_deeper_than(raw, MAX_NESTING),
            "check_ms": round(median_ms(lambda: nests_deeper_than(raw, MAX_NESTING), len(raw), args.repeats), 3)}  # noqa: B023
        if not name.startswith("hostile"):
            row["orjson_loads_ms"] = round(median_ms(lambda: orjson.loads(raw), len(raw), args.repeats), 3)  # noqa: B023
        results[name] = row
        if not args.json:
            line = (f"{name}: {row['mb']:.2f} MB, {row['brackets']} [ and {{, deeper than {MAX_NESTING}: "
                    f"{row['deeper_than_bound']}, check {row['check_ms']:.3f} ms")
            if "orjson_loads_ms" in row:
                line += f", orjson.loads {row['orjson_loads_ms']:.3f} ms"
            print(line, flush=True)
    if args.json:
        print(json.dumps({"bench": "json_nesting", "max_nesting": MAX_NESTING, "bodies": results}))

if __name__ == "__main__":
    main()
