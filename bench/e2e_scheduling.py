"""End-to-end scheduling throughput through the real kube-scheduler v1.20.2, with and without the extender.

One cluster from ``gpupool testenv`` (etcd, kube-apiserver, kube-scheduler v1.20.2 on this machine):

1. ``--nodes`` Node objects of 8 cards each (bench/e2e_objects.py: the bundled cluster's most common
   8-card machine, its inventory annotation and extended resources, Ready; no kubelets), created by
   ``--create-threads`` clients;
2. the extender as ``gpupool extender`` runs it (bench/e2e_extender.py: leader election, watches,
   default policy, scoring against the trace's workload profile as it would once such pods run;
   ``--fresh-profile`` keeps the empty profile of a fresh cluster, under which every node scores
   alike), and kube-scheduler with the shipped configuration of ``--mode`` pointed at it
   (bench/e2e_scheduler.py), its client limited to ``--scheduler-qps``/``--scheduler-burst``.
   ``--mode best-only`` (the default): ``deploy/scheduler-config-v1beta1.yaml`` (filter, bind) and
   the extender's ``--filter-best-only``; ``--mode prioritize``:
   ``deploy/scheduler-config-v1beta1-prioritize.yaml`` (filter, prioritize, bind) and
   ``--no-filter-best-only``;
3. **GPU phase**: ``--gpu-pods`` pods with the trace's shapes created at once; kube-scheduler asks
   the extender to filter (and, in ``prioritize`` mode, prioritize) and bind each;
4. **CPU phase**, same cluster and scheduler: ``--cpu-pods`` CPU-only pods of the trace created at
   once; ``managedResources`` keeps them away from the extender and kube-scheduler binds them itself.

``gpu_pods_per_s``/``cpu_pods_per_s``: pods bound / (last pod seen bound - first creation sent), the
binds stamped by a watch opened before the pods were created. Per phase, kube-scheduler's own
latencies from its ``/metrics`` (1.20 has no series per extender: the scheduling algorithm's
duration includes the extender's filter and prioritize round trips, the binding duration its bind;
see bench/e2e_scheduler.py), the extender's own handler times per verb, the scheduling cycle as
the extender sees it (``cycle_ms``: its handlers and kube-scheduler's share between them), where
its event loop's time went per request (``extender_loop_ms``: CPU, run queue, interpreter lock),
and the CPU seconds etcd, kube-apiserver, kube-scheduler, the extender and this process spent.
``--pprof-dir`` saves a CPU profile of kube-scheduler per phase, ``--profile-extender`` a cProfile
of the extender's event loop. At the end every assignment
on a pod is checked: ``double_booked_cards`` counts cards whose assignments add up to more memory or
compute than the card has.

    python3 bench/e2e_scheduling.py --json
    python3 bench/e2e_scheduling.py --nodes 20 --gpu-pods 40 --cpu-pods 40 --json
    python3 bench/e2e_scheduling.py --mode prioritize --json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.e2e_extender import LEASE_PATH, BenchExtender, cycle_breakdown, handler_split
from bench.e2e_kube import Api, ApiError, BoundWatch, card_overcommits
from bench.e2e_objects import (
    NodeShape,
    common_shape,
    cpu_pods,
    demand,
    gpu_pods,
    node_manifest,
    node_spec,
    pod_manifest,
)
from bench.e2e_scheduler import (
    HISTOGRAMS,
    SHIPPED_CONFIGS,
    histogram_delta,
    scheduler_config,
    start_scheduler,
    summary_ms,
)
from bench.extender import cpu_times, steal_share
from bench.extender_binds import process_cpu_s

NAMESPACE = "bench"
TRACE = "default"
"""The bundled trace the pods are drawn from, and whose workload profile the extender scores against."""
DEFAULT_QPS = 1000.0
DEFAULT_BURST = 1000
"""kube-scheduler's client limit in both phases: high enough that neither phase waits for it here
(v1beta1's defaults, 50/100, would hold the CPU phase at 50 Bindings/s; see --scheduler-qps)."""


def log(message: str) -> None:
    print(f"[e2e-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


@dataclass(frozen=True)
class Components:
    """Everything the run started, for CPU accounting and teardown."""

    plane: Any
    extender: BenchExtender
    scheduler: Any

    def cpu_s(self) -> dict[str, float]:
        times = os.times()
        pid = self.extender.proc.pid
        extender, loop = process_cpu_s(pid), thread_cpu_s(pid, pid)
        return {"etcd": process_cpu_s(self.plane.etcd.pid), "kube_apiserver": process_cpu_s(self.plane.apiserver.pid),
                "kube_scheduler": process_cpu_s(self.scheduler.process.pid),
                "extender": extender, "extender_loop_thread": loop, "extender_other_threads": extender - loop,
                "bench": times.user + times.system}


def thread_cpu_s(pid: int, tid: int) -> float:
    """User + system CPU seconds of one thread (``/proc/<pid>/task/<tid>/stat``), 0 where unreadable.

    The extender's event loop runs on its main thread (tid = pid): filter, prioritize and the HTTP
    side of every request; binds, watches and housekeeping run on other threads."""
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_phase(label: str, api: Api, watch: BoundWatch, parts: Components, manifests: list[dict[str, Any]],
              opts: argparse.Namespace) -> dict[str, Any]:
    """Create ``manifests`` at once and wait until all are bound; what the phase measured."""
    threads, timeout = opts.create_threads, opts.timeout
    names = [m["metadata"]["name"] for m in manifests]
    parts.extender.timings(reset=True)
    scraped = parts.scheduler.scrape()
    cpu_before, counters = parts.cpu_s(), cpu_times()
    if opts.pprof_dir:
        Path(opts.pprof_dir).mkdir(parents=True, exist_ok=True)
        profiling = parts.scheduler.cpu_profile(opts.pprof_seconds,
                                                Path(opts.pprof_dir) / f"kube-scheduler-{label}.pprof")
    started = api.create_all(f"/api/v1/namespaces/{NAMESPACE}/pods", manifests, threads)
    created = time.monotonic()
    log(f"{label}: {len(names)} pods created in {created - started:.1f} s; waiting for binds")
    missing = watch.wait_bound(names, timeout)
    stamps = [watch.bound[n] for n in names if n in watch.bound]
    last = max(stamps, default=created)
    cpu_after, stolen = parts.cpu_s(), steal_share(counters, cpu_times())
    after = settled_scrape(parts.scheduler, scraped, len(stamps))
    timings = parts.extender.timings()
    if opts.pprof_dir:
        profiling.join()
    seconds = last - started
    log(f"{label}: {len(stamps)} of {len(names)} bound in {seconds:.1f} s"
        + (f"; not bound: {missing[:5]}{'...' if len(missing) > 5 else ''}" if missing else ""))
    if watch.failure:
        log(f"{label}: the watch failed: {watch.failure}")
    return {
        "pods": len(names), "bound": len(stamps),
        "pods_per_s": round(len(stamps) / seconds, 1) if seconds > 0 and stamps else 0.0,
        "seconds": round(seconds, 2), "create_s": round(created - started, 2),
        "first_to_last_bound_s": round(last - min(stamps), 2) if stamps else None,
        "kube_scheduler": {name.removeprefix("scheduler_").removesuffix("_seconds"):
                           summary_ms(histogram_delta(after, scraped, name)) for name in HISTOGRAMS}
        | {"attempts": {k.split(":", 1)[1]: int(v - scraped.get(k, 0.0))
                        for k, v in after.items() if k.startswith("attempts:")}},
        "extender_ms": {verb: {"p50": round(statistics.median(ms), 2), "p99": round(pct(ms, 99), 2),
                               "count": len(ms)} for verb, ms in sorted(timings["ms"].items()) if ms},
        "extender_outcomes": timings["outcomes"],
        "cycle_ms": cycle_breakdown(timings["stamps"]),
        "extender_loop_ms": handler_split(timings["spent"]),
        "cpu_s": {k: round(cpu_after[k] - cpu_before[k], 2) for k in cpu_after},
        "cpu_steal_pct": None if stolen is None else round(100 * stolen, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def settled_scrape(scheduler: Any, before: dict[str, Any], bound: int, wait_s: float = 10.0) -> dict[str, Any]:
    """kube-scheduler's metrics once it has counted every bound pod as scheduled.

    The watch can see a pod bound before kube-scheduler's binding goroutine has recorded its bind
    (the extender's answer or the Binding's is still on its way back), so scrape until the count of
    scheduled attempts caught up, for at most ``wait_s``.
    """
    deadline = time.monotonic() + wait_s
    while True:
        after: dict[str, Any] = scheduler.scrape()
        done = after.get("attempts:scheduled", 0.0) - before.get("attempts:scheduled", 0.0)
        if done >= bound or time.monotonic() > deadline:
            return after
        time.sleep(0.2)


def start(opts: argparse.Namespace, shape: NodeShape) -> tuple[Components, Api]:
    from gpupool.testenv.build import ensure_binaries
    from gpupool.testenv.controlplane import start_control_plane
    from gpupool.testenv.ports import free_ports

    binaries = ensure_binaries(log)
    plane = start_control_plane(binaries, with_scheduler=False)
    try:
        api = Api(plane.server, plane.token, plane.ca_cert, connections=max(32, opts.create_threads))
        api.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        heartbeat = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        nodes = [node_manifest(node_spec(f"node-{i:05d}", shape), heartbeat) for i in range(opts.nodes)]
        began = time.monotonic()
        api.create_all("/api/v1/nodes", nodes, opts.create_threads)
        log(f"{opts.nodes} nodes created in {time.monotonic() - began:.1f} s")
        extender_port, scheduler_port = free_ports(2)
        extender = BenchExtender(plane.kubeconfig, extender_port, plane.state_dir / "logs" / "extender.log",
                                 policy=opts.policy,
                                 profile=Path(opts.profile_extender) if opts.profile_extender else None,
                                 workload=None if opts.fresh_profile else TRACE,
                                 filter_best_only=opts.mode == "best-only", filter_one_best=not opts.filter_all_best)
        try:
            extender.wait_ready(lambda: _lease_holder(api))
            config = scheduler_config(plane.kubeconfig, extender.url, opts.scheduler_qps, opts.scheduler_burst,
                                      SHIPPED_CONFIGS[opts.mode])
            scheduler = start_scheduler(binaries, plane.state_dir, config, scheduler_port,
                                        kubeconfig=plane.kubeconfig, token=plane.token)
        except BaseException:
            extender.stop()
            raise
        log(f"extender leading, kube-scheduler up (logs in {plane.state_dir / 'logs'})")
        return Components(plane, extender, scheduler), api
    except BaseException:
        plane.stop()
        raise


def _lease_holder(api: Api) -> str | None:
    try:
        lease = api.call("GET", LEASE_PATH)
    except ApiError:
        return None
    holder: str | None = (lease.get("spec") or {}).get("holderIdentity")
    return holder


def measure(opts: argparse.Namespace) -> dict[str, Any]:
    shape = common_shape()
    gpu = gpu_pods(opts.gpu_pods, shape, opts.nodes, opts.seed, TRACE)
    cpu = cpu_pods(opts.cpu_pods, shape, opts.seed, TRACE)
    cpu_need = demand(gpu.pods)[0] + demand(cpu.pods)[0]
    if cpu_need > opts.nodes * shape.cpu_milli * opts.max_cpu_share:
        raise SystemExit(f"the pods ask {cpu_need / 1000:.0f} cores of {opts.nodes * shape.cpu_milli / 1000:.0f}: "
                         f"more than {opts.max_cpu_share:.0%}; use more --nodes or fewer pods")
    load_start = os.getloadavg()[0]
    parts, api = start(opts, shape)
    try:
        _, version = api.list_items(f"/api/v1/namespaces/{NAMESPACE}/pods")
        watch = BoundWatch(api, NAMESPACE, version)
        watch.start()
        phases = {}
        for label, drawn, prefix in (("gpu", gpu, "gpu"), ("cpu", cpu, "cpu")):
            manifests = [pod_manifest(p, f"{prefix}-{i:05d}", NAMESPACE) for i, p in enumerate(drawn.pods)]
            phases[label] = run_phase(label, api, watch, parts, manifests, opts)
        pods, _ = api.list_items(f"/api/v1/namespaces/{NAMESPACE}/pods")
        over, wrong = card_overcommits(pods, shape.card_mib)
        watch.stopping = True
    finally:
        parts.scheduler.stop()
        parts.extender.stop()
        parts.plane.stop()
    gpu_rate, cpu_rate = phases["gpu"]["pods_per_s"], phases["cpu"]["pods_per_s"]
    return {
        "gpu_pods_per_s": gpu_rate, "cpu_pods_per_s": cpu_rate,
        "gpu_to_cpu": round(gpu_rate / cpu_rate, 3) if cpu_rate else None,
        "nodes": opts.nodes, "cards_per_node": 8, "gpu_pods": opts.gpu_pods, "cpu_pods": opts.cpu_pods,
        "gpu_bound": phases["gpu"]["bound"], "cpu_bound": phases["cpu"]["bound"],
        "double_booked_cards": over, "wrong_assignments": wrong,
        "scheduler_qps": opts.scheduler_qps, "scheduler_burst": opts.scheduler_burst,
        "policy": opts.policy, "seed": opts.seed, "mode": opts.mode,
        "extender_workload_profile": None if opts.fresh_profile else TRACE,
        "skipped_too_large": gpu.skipped_too_large + cpu.skipped_too_large,
        "kube_scheduler_series": "scheduling_algorithm_duration_seconds (filter+score incl. the extender's "
                                 "filter and prioritize), binding_duration_seconds (the extender's bind for GPU "
                                 "pods), e2e_scheduling_duration_seconds{result=scheduled}",
        "load_average_1m_start": round(load_start, 2), "load_average_1m_end": round(os.getloadavg()[0], 2),
        "phases": phases,
    }


def table(result: dict[str, Any]) -> str:
    rows = [("nodes x cards", f"{result['nodes']} x {result['cards_per_node']}"),
            ("mode (scheduler configuration)", result["mode"]),
            ("kube-scheduler client qps / burst", f"{result['scheduler_qps']:g} / {result['scheduler_burst']}")]
    for label in ("gpu", "cpu"):
        phase = result["phases"][label]
        ks = phase["kube_scheduler"]
        rows += [(f"{label}: pods bound / created", f"{phase['bound']} / {phase['pods']}"),
                 (f"{label}: pods/s (creation to bound)", f"{phase['pods_per_s']} ({phase['seconds']} s, "
                                                           f"creating took {phase['create_s']} s)"),
                 (f"{label}: kube-scheduler algorithm p50 / p99 ms",
                  f"{ks['scheduling_algorithm_duration']['p50_ms']} / {ks['scheduling_algorithm_duration']['p99_ms']}"),
                 (f"{label}: kube-scheduler binding p50 / p99 ms",
                  f"{ks['binding_duration']['p50_ms']} / {ks['binding_duration']['p99_ms']}"),
                 (f"{label}: schedule attempts", json.dumps(ks["attempts"])),
                 (f"{label}: extender handler ms", json.dumps(phase["extender_ms"])),
                 (f"{label}: cycle seen by the extender ms", json.dumps(phase["cycle_ms"])),
                 (f"{label}: extender loop thread per request ms", json.dumps(phase["extender_loop_ms"])),
                 (f"{label}: CPU s", json.dumps(phase["cpu_s"]))]
    rows += [("gpu / cpu pods/s", str(result["gpu_to_cpu"])),
             ("double-booked cards / wrong assignments", f"{result['double_booked_cards']} / "
                                                         f"{result['wrong_assignments']}"),
             ("load average (1 min) start / end", f"{result['load_average_1m_start']} / "
                                                  f"{result['load_average_1m_end']}")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpu-pods", type=int, default=2000)
    p.add_argument("--cpu-pods", type=int, default=2000)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--policy", default="gpupool", help="the extender's --policy")
    p.add_argument("--mode", choices=sorted(SHIPPED_CONFIGS), default="best-only",
                   help="the shipped scheduler configuration (best-only: no prioritizeVerb, the extender's "
                        "--filter-best-only; prioritize: the -prioritize.yaml variant, --no-filter-best-only)")
    p.add_argument("--filter-all-best", action="store_true",
                   help="the extender's --filter-all-best: every best node passed, kube-scheduler's plugins choose")
    p.add_argument("--scheduler-qps", type=float, default=DEFAULT_QPS)
    p.add_argument("--scheduler-burst", type=int, default=DEFAULT_BURST)
    p.add_argument("--create-threads", type=int, default=16)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a phase may take to bind its pods")
    p.add_argument("--max-cpu-share", type=float, default=0.7,
                   help="refuse pod counts whose CPU requests pass this share of the nodes' CPU")
    p.add_argument("--pprof-dir", default=None,
                   help="save a CPU profile of kube-scheduler per phase here (kube-scheduler-<phase>.pprof)")
    p.add_argument("--pprof-seconds", type=int, default=15, help="length of each profile, from the phase's start")
    p.add_argument("--profile-extender", default=None,
                   help="write cProfile stats of the extender's event loop (both phases) to this file")
    p.add_argument("--fresh-profile", action="store_true",
                   help="leave the extender the profile it makes at start (no pods: every node scores alike)")
    p.add_argument("--json", action="store_true", help="print one JSON line after the table")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    result = measure(opts)
    print(table(result))
    if opts.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
