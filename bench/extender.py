"""Benchmark of the scheduler extender: filter+prioritize latency over HTTP, and binds per second.

Filter+prioritize: the extender's aiohttp app, in a forked child process, over a ledger of
``--nodes`` nodes of ``--gpus-per-node`` cards (half full with random slices), asked about a pod with
*all* node names (``nodeCacheCapable``), as kube-scheduler asks, by a keep-alive HTTP client in this
process. One sample is the two round trips (filter, then prioritize with the nodes that passed),
from sending each request to having read each answer; ``filter_prioritize_p50_ms``/``_p99_ms`` are
those, what kube-scheduler waits for. ``server_side_*`` are the handlers' own durations in the same
samples (from the request's headers to the answer's body, without the HTTP transfer). After every
sample the pod is booked on the best node, so the ledger changes as it does in a cluster.
``filter_p50_ms``/``_p99_ms``: the filter round trip alone. ``--filter-best-only``: the extender
passes only its best nodes and a sample is that filter alone (the configuration without
``prioritizeVerb``; the pod is booked on the first node passed).

Scrapes: a second run of ``--samples`` samples with a scraper thread in the client process that GETs
the extender's ``/metrics`` every ``--scrape-interval`` seconds (as Prometheus would, on its own
connection); ``filter_prioritize_p99_ms_scraped`` is that run's round-trip p99 and
``scrape_p50_ms``/``scrape_max_ms`` the scrapes' own durations. ``scrape_lock_hold_ms`` and
``scrape_render_ms`` come from scraping the same ledger in this process before the server starts:
the longest hold of the ledger lock during a scrape, and the whole scrape.

Binds: ``--binds`` pods bound by ``--bind-threads`` threads (8: the extender's bind pool), see
bench/extender_binds.py. Against the real apiserver from ``gpupool testenv`` (``--apiserver
real``; ``auto`` uses it when its binaries are built and warns on stderr when it falls back to the
in-process :class:`FakePodApi`); the table and the JSON say which (``"apiserver": "real"|"fake"``).
``--bind-writes 2`` measures the two-write bind (PATCH, then Binding) instead of the Binding that
carries the assignment. Every recorded assignment is checked afterwards: a card booked beyond its
memory is reported as ``double_booked_cards``.

Tenancy: with ``--groups N`` and/or ``--quotas M`` the same cluster is also measured with N resource
groups and M namespaces with a GpuQuota each (bench/extender_tenancy.py), whose pods each name a
group and live in a quota's namespace, alternating ``--tenancy-rounds`` times with runs of the plain
pods (no scrapes in either): ``tenancy_p99_ms`` against ``plain_p99_ms`` (and their ratio), both from
this one run.

    python3 bench/extender.py --nodes 5000 --gpus-per-node 8 --json
    python3 bench/extender.py --binds-only --apiserver real --binds 2000 --json
    python3 bench/extender.py --groups 100 --quotas 1000 --apiserver fake --binds 20 --json

The cluster is built by bench/extender_cluster.py, the HTTP measurements are bench/extender_latency.py.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.extender_binds import APISERVER_MODES, binds
from bench.extender_cluster import build_cache
from bench.extender_latency import latency, scrape_cost
from bench.extender_tenancy import install, plain_pods, tenant_pods
from gpupool.extender.gc_freeze import freeze_long_lived


def cpu_times() -> list[int] | None:
    """The machine's aggregate CPU time counters (``/proc/stat``), or None where there are none."""
    try:
        with open("/proc/stat") as stat:
            return [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def steal_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """Share of CPU time the hypervisor gave to others (``steal``, the 8th counter) between two reads.

    Why in a benchmark: on a virtual machine a run whose vCPUs wait for the host is slow for reasons
    no code change can remove; the share says whether a slow run was such a run.
    """
    if before is None or after is None or len(before) < 8 or len(after) < 8:
        return None
    spent = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(spent[:8])
    return spent[7] / total if total > 0 else None


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument(
        "--fill", type=float, default=0.5, help="share of cards holding a slice before timing"
    )
    parser.add_argument("--binds", type=int, default=400)
    parser.add_argument("--bind-nodes", type=int, default=50)
    parser.add_argument("--bind-threads", type=int, default=8)
    parser.add_argument("--bind-writes", type=int, choices=[1, 2], default=1,
                        help="1: the Binding carries the assignment; 2: PATCH the assignment, then bind")
    parser.add_argument("--binds-only", action="store_true", help="measure the binds only")
    parser.add_argument("--apiserver", choices=APISERVER_MODES, default="auto")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scrape-interval", type=float, default=1.0,
                        help="seconds between /metrics scrapes in the second run of samples; 0: no such run")
    parser.add_argument("--filter-best-only", action="store_true",
                        help="the extender's --filter-best-only, samples without prioritize (no prioritizeVerb)")
    parser.add_argument("--groups", type=int, default=0, help="resource groups for the tenancy comparison")
    parser.add_argument("--quotas", type=int, default=0, help="namespaces with a GpuQuota for the comparison")
    parser.add_argument("--tenancy-rounds", type=int, default=2,
                        help="alternations of plain and tenancy runs (each --samples samples)")
    parser.add_argument("--json", action="store_true", help="print one JSON object after the table")
    opts = parser.parse_args()
    rng = random.Random(opts.seed)
    if opts.binds_only:
        report_binds(opts, rng)
        return
    timings: dict[str, float] = {}
    cache, names = build_cache(opts.nodes, opts.gpus_per_node, opts.fill, rng, timings)
    freeze_long_lived()  # as the extender does once its cache has synced (gpupool/extender/gc_freeze.py)
    cost = scrape_cost(cache)
    counters = cpu_times()
    runs = latency(cache, names, opts.samples, rng, opts.scrape_interval, best_only=opts.filter_best_only)
    stolen = steal_share(counters, cpu_times())
    samples, server, scraped, scrapes = runs.round_trip, runs.server, runs.round_trip_scraped, runs.scrapes
    tenancy = compare_tenancy(cache, names, opts, rng) if opts.groups or opts.quotas else {}
    bind_stats = binds(opts.binds, opts.bind_nodes, opts.gpus_per_node, opts.apiserver, rng,
                       threads=opts.bind_threads, one_write=opts.bind_writes == 1)
    result = {
        "filter_prioritize_p50_ms": round(statistics.median(samples), 2),
        "filter_prioritize_p99_ms": round(pct(samples, 99), 2),
        "filter_p50_ms": round(statistics.median(runs.filter), 2),
        "filter_p99_ms": round(pct(runs.filter, 99), 2),
        "filter_best_only": opts.filter_best_only,
        "binds_per_s": bind_stats["binds_per_s"],
        "server_side_p50_ms": round(statistics.median(server), 2),
        "server_side_p99_ms": round(pct(server, 99), 2),
        "cpu_steal_pct": None if stolen is None else round(100 * stolen, 1),
        "filter_prioritize_p99_ms_scraped": round(pct(scraped, 99), 2) if scraped else None,
        "scrapes": len(scrapes),
        "scrape_p50_ms": round(statistics.median(scrapes), 2) if scrapes else None,
        "scrape_max_ms": round(max(scrapes), 2) if scrapes else None,
        "scrape_lock_hold_ms": round(cost["lock_hold_ms"], 3),
        "scrape_render_ms": round(cost["render_ms"], 2),
        "scrape_bytes": int(cost["bytes"]),
        "ledger_build_s": round(timings["ledger_s"], 2),
        "fill_s": round(timings["fill_s"], 1),
        **tenancy,
    }
    rows = [
        ("nodes x cards", f"{opts.nodes} x {opts.gpus_per_node}"),
        ("ledger from the node list (s)", f"{timings['ledger_s']:.2f}"),
        ("fill: slices booked one by one (s)", f"{timings['fill_s']:.1f}"),
        ("filter+prioritize samples", str(len(samples))),
        (
            "round trip p50 / p99 (ms), client in another process",
            f"{result['filter_prioritize_p50_ms']:.2f} / {result['filter_prioritize_p99_ms']:.2f}",
        ),
        ("  filter alone p50 / p99 (ms)" + (" (best only)" if opts.filter_best_only else ""),
         f"{result['filter_p50_ms']:.2f} / {result['filter_p99_ms']:.2f}"),
        (
            "  of which in the handlers p50 / p99 (ms)",
            f"{result['server_side_p50_ms']:.2f} / {result['server_side_p99_ms']:.2f}",
        ),
        ("  CPU time stolen by the hypervisor meanwhile (%)", str(result["cpu_steal_pct"])),
        (f"round trip p99 (ms) with /metrics scraped every {opts.scrape_interval:g} s",
         str(result["filter_prioritize_p99_ms_scraped"])),
        ("  scrapes, their p50 / max (ms)",
         f"{result['scrapes']}, {result['scrape_p50_ms']} / {result['scrape_max_ms']}"),
        ("one scrape in process: lock held / whole (ms), bytes",
         f"{result['scrape_lock_hold_ms']} / {result['scrape_render_ms']}, {result['scrape_bytes']}"),
        *tenancy_rows(tenancy),
        *bind_rows(bind_stats),
    ]
    print_table(rows)
    if opts.json:
        print(json.dumps({**result, **{k: v for k, v in bind_stats.items() if k != "binds_per_s"}}))


def compare_tenancy(cache: Any, names: list[str], opts: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    """Plain runs and runs with ``--groups`` groups and ``--quotas`` quotas, alternating, on one
    ledger; round trips and the handlers' times of each kind."""
    plain: tuple[list[float], list[float]] = ([], [])
    tenancy: tuple[list[float], list[float]] = ([], [])
    for _ in range(opts.tenancy_rounds):
        for kind, collect in (("plain", plain), ("tenancy", tenancy)):
            with_objects = kind == "tenancy"
            install(cache, names, opts.groups if with_objects else 0, opts.quotas if with_objects else 0,
                    opts.gpus_per_node)
            pods = tenant_pods(rng, opts.groups, opts.quotas) if with_objects else plain_pods(rng)
            runs = latency(cache, names, opts.samples, rng, 0.0, pods)
            collect[0].extend(runs.round_trip)
            collect[1].extend(runs.server)
    install(cache, names, 0, 0, opts.gpus_per_node)
    p99_plain, p99_tenancy = pct(plain[0], 99), pct(tenancy[0], 99)
    return {"groups": opts.groups, "quotas": opts.quotas, "tenancy_samples": len(tenancy[0]),
            "plain_p50_ms": round(statistics.median(plain[0]), 2), "plain_p99_ms": round(p99_plain, 2),
            "tenancy_p50_ms": round(statistics.median(tenancy[0]), 2), "tenancy_p99_ms": round(p99_tenancy, 2),
            "tenancy_p99_ratio": round(p99_tenancy / p99_plain, 3),
            "plain_server_p99_ms": round(pct(plain[1], 99), 2),
            "tenancy_server_p99_ms": round(pct(tenancy[1], 99), 2)}


def tenancy_rows(found: dict[str, Any]) -> list[tuple[str, str]]:
    if not found:
        return []
    return [
        (f"with {found['groups']} groups, {found['quotas']} quotas: round trip p50 / p99 (ms)",
         f"{found['tenancy_p50_ms']:.2f} / {found['tenancy_p99_ms']:.2f}"),
        ("  the plain pods alternating with them p50 / p99 (ms)",
         f"{found['plain_p50_ms']:.2f} / {found['plain_p99_ms']:.2f}"),
        ("  p99 ratio tenancy / plain; handlers' p99 (ms) tenancy / plain",
         f"{found['tenancy_p99_ratio']:.3f}; {found['tenancy_server_p99_ms']:.2f} / "
         f"{found['plain_server_p99_ms']:.2f}"),
    ]


def bind_rows(stats: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        ("apiserver (binds against)", f"{stats['apiserver']}: {stats['binds_against']}"),
        (f"binds/s ({stats['bind_threads']} threads, {stats['bind_writes']} write(s) per bind)",
         f"{stats['binds_per_s']:.1f}"),
        ("binds ok / refused", f"{stats['binds_ok']} / {stats['binds_refused']}"),
        ("double-booked cards", str(stats["double_booked_cards"])),
        ("CPU s during the binds", ", ".join(f"{k} {v}" for k, v in stats["bind_cpu_s"].items())),
        ("load average (1 min) after the binds", str(stats["load_average_1m"])),
    ]


def print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def report_binds(opts: argparse.Namespace, rng: random.Random) -> None:
    stats = binds(opts.binds, opts.bind_nodes, opts.gpus_per_node, opts.apiserver, rng,
                  threads=opts.bind_threads, one_write=opts.bind_writes == 1)
    print_table(bind_rows(stats))
    if opts.json:
        print(json.dumps(stats))


if __name__ == "__main__":
    main()
