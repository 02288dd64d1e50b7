"""End-to-end scheduling throughput through the current kube-scheduler (v1.37.2), with and
without the extender, on nodes simulated by KWOK.

One cluster from ``gpupool testenv`` (etcd, kube-apiserver, kube-scheduler of the pinned release,
built on this machine) and KWOK (``gpupool.testenv.kwok``), with gpupool's CRDs installed from
``deploy/crds`` as every install does (``crds``; without them the extender's GpuQuota and
ResourceGroup watches are answered 404 and retried every second for the whole run):

1. ``--nodes`` nodes of 8 cards each (bench/e2e_objects.py: the bundled cluster's most common
   8-card machine, its inventory annotation and extended resources), created by
   ``--create-threads`` clients and managed by KWOK (bench/e2e_nodes.py): it makes them Ready,
   renews their Leases every 10 s as kubelets do (``--lease-duration-s``) and moves every pod bound
   to them to Running. ``--no-kwok``: bare Node objects created Ready, nothing renewed, pods stay
   Pending after their bind;
2. the extender as ``gpupool extender`` runs it (bench/e2e_extender.py: leader election, watches,
   default policy, scoring against the trace's workload profile as it would once such pods run;
   ``--fresh-profile`` keeps the empty profile of a fresh cluster, under which every node scores
   alike), and kube-scheduler with the shipped configuration of ``--mode`` pointed at it
   (bench/e2e_scheduler.py), its client limited to ``--scheduler-qps``/``--scheduler-burst``.
   ``--mode best-only`` (the default): ``deploy/scheduler-config-v1.yaml`` (filter, bind) and
   the extender's ``--filter-best-only``; ``--mode prioritize``:
   ``deploy/scheduler-config-v1-prioritize.yaml`` (filter, prioritize, bind) and
   ``--no-filter-best-only``;
3. **GPU phase**: ``--gpu-pods`` pods with the trace's shapes created at once; kube-scheduler asks
   the extender to filter (and, in ``prioritize`` mode, prioritize) and bind each;
4. **CPU phase**, same cluster and scheduler: ``--cpu-pods`` CPU-only pods of the trace created at
   once; ``managedResources`` keeps them away from the extender and kube-scheduler binds them itself.

``gpu_pods_per_s``/``cpu_pods_per_s``: pods bound / (last pod seen bound - first creation sent), the
binds stamped by a watch opened before the pods were created. ``p99_latency_ms``: per pod, from
the apiserver's answer to its creation to the watch seeing it bound (all pods of a phase are created
at once, so this is mostly the wait in kube-scheduler's queue). ``extender_cpu_ms_per_gpu_pod``: the
extender's CPU in the GPU phase per pod bound. ``failed_binds``: scheduling attempts kube-scheduler
counted as ``error`` (a refused bind, the extender's or its own) in both phases. Per phase,
kube-scheduler's own latencies from its ``/metrics`` (no series per extender: the algorithm's
duration includes the extender's filter and prioritize round trips, the attempt's its bind, the
SLI's the queue; see bench/e2e_scheduler.py), the extender's own handler times per verb, the
scheduling cycle as the extender sees it (``cycle_ms``: its handlers and kube-scheduler's share
between them), where its event loop's time went per request (``extender_loop_ms``: CPU, run queue,
interpreter lock), how soon KWOK made a bound pod Running, and the CPU seconds etcd,
kube-apiserver, kube-scheduler, KWOK, the extender and this process spent. ``--pprof-dir`` saves a
CPU profile of kube-scheduler per phase, ``--profile-extender`` a cProfile of the extender's event
loop. At the end every assignment on a pod is checked: ``double_booked_cards`` counts cards whose
assignments add up to more memory or compute than the card has.

    python3 bench/e2e_scheduling.py --json
    python3 bench/e2e_scheduling.py --nodes 5000 --json
    python3 bench/e2e_scheduling.py --nodes 20 --gpu-pods 40 --cpu-pods 40 --json
    python3 bench/e2e_scheduling.py --mode prioritize --no-kwok --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.e2e_extender import LEASE_PATH, BenchExtender, cycle_breakdown, handler_split, thread_cpu_s
from bench.e2e_kube import Api, ApiError, BoundWatch, card_overcommits, forced_watch_closes, install_crds
from bench.e2e_nodes import Nodes, create_nodes, wait_running
from bench.e2e_objects import NodeShape, common_shape, cpu_pods, demand, gpu_pods, pod_manifest
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
CRD_DIR = Path(__file__).resolve().parents[1] / "deploy" / "crds"
"""gpupool's CustomResourceDefinitions (GpuQuota, ResourceGroup; its kustomization lists them),
installed as every install does."""
TRACE = "default"
"""The bundled trace the pods are drawn from, and whose workload profile the extender scores against."""
DEFAULT_QPS = 1000.0
DEFAULT_BURST = 1000
"""kube-scheduler's client limit in both phases: high enough that neither phase waits for it here
(v1's defaults, 50/100, would hold the CPU phase at 50 Bindings/s; see --scheduler-qps)."""


def log(message: str) -> None:
    print(f"[e2e-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def spread_ms(values: list[float]) -> dict[str, float | None]:
    """p50 and p99 in ms of durations in seconds (``None`` when there are none)."""
    if not values:
        return {"p50": None, "p99": None}
    return {"p50": round(1000 * statistics.median(values), 1), "p99": round(1000 * pct(values, 99), 1)}


@dataclass(frozen=True)
class Components:
    """Everything the run started, for CPU accounting and teardown."""

    plane: Any
    nodes: Nodes
    extender: BenchExtender
    scheduler: Any
    crds: tuple[str, ...] = ()

    def cpu_s(self) -> dict[str, float]:
        times = os.times()
        pid = self.extender.proc.pid
        extender, loop = process_cpu_s(pid), thread_cpu_s(pid, pid)
        return {"etcd": process_cpu_s(self.plane.etcd.pid), "kube_apiserver": process_cpu_s(self.plane.apiserver.pid),
                "kube_scheduler": process_cpu_s(self.scheduler.process.pid),
                "kwok": process_cpu_s(self.nodes.kwok.pid) if self.nodes.kwok is not None else 0.0,
                "extender": extender, "extender_loop_thread": loop, "extender_other_threads": extender - loop,
                "bench": times.user + times.system}

    def stop(self) -> None:
        self.scheduler.stop()
        self.extender.stop()
        self.nodes.stop()
        self.plane.stop()


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
    answered: dict[str, float] = {}
    started = api.create_all(f"/api/v1/namespaces/{NAMESPACE}/pods", manifests, threads, answered)
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
    latency = [watch.bound[n] - answered[n] for n in names if n in watch.bound and n in answered]
    running = [watch.running[n] - watch.bound[n] for n in names if n in watch.running and n in watch.bound]
    attempts = {k.split(":", 1)[1]: int(v - scraped.get(k, 0.0)) for k, v in after.items() if k.startswith("attempts:")}
    return {
        "pods": len(names), "bound": len(stamps),
        "pods_per_s": round(len(stamps) / seconds, 1) if seconds > 0 and stamps else 0.0,
        "seconds": round(seconds, 2), "create_s": round(created - started, 2),
        "first_to_last_bound_s": round(last - min(stamps), 2) if stamps else None,
        "created_to_bound_ms": spread_ms(latency),
        "running_when_bound": len(running), "bound_to_running_ms": spread_ms(running),
        "kube_scheduler": {name.removeprefix("scheduler_").removesuffix("_seconds"):
                           summary_ms(histogram_delta(after, scraped, name)) for name in HISTOGRAMS}
        | {"attempts": attempts},
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
    nodes: Nodes | None = None
    try:
        api = Api(plane.server, plane.token, plane.ca_cert, connections=max(32, opts.create_threads))
        api.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        crds = install_crds(api, [CRD_DIR / name for name in yaml.safe_load((CRD_DIR / "kustomization.yaml")
                                                                           .read_text())["resources"]])
        nodes = create_nodes(api, plane, shape, opts.nodes, kwok=opts.kwok, threads=opts.create_threads,
                             lease_duration_s=opts.lease_duration_s, timeout=opts.timeout, log=log)
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
        return Components(plane, nodes, extender, scheduler, tuple(crds)), api
    except BaseException:
        if nodes is not None:
            nodes.stop()
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
    parts.plane.remove_state_on_stop = not opts.keep_state
    try:
        _, version = api.list_items(f"/api/v1/namespaces/{NAMESPACE}/pods")
        watch = BoundWatch(api, NAMESPACE, version)
        watch.start()
        phases = {}
        for label, drawn, prefix in (("gpu", gpu, "gpu"), ("cpu", cpu, "cpu")):
            manifests = [pod_manifest(p, f"{prefix}-{i:05d}", NAMESPACE) for i, p in enumerate(drawn.pods)]
            phases[label] = run_phase(label, api, watch, parts, manifests, opts)
        all_running_s = wait_running(api, NAMESPACE, opts.timeout) if opts.kwok else None
        pods, _ = api.list_items(f"/api/v1/namespaces/{NAMESPACE}/pods")
        over, wrong = card_overcommits(pods, shape.card_mib)
        running = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
        watch.stopping = True
        closes = forced_watch_closes(parts.plane.state_dir / "logs" / "kube-apiserver.log")
    finally:
        parts.stop()
    gpu_rate, cpu_rate = phases["gpu"]["pods_per_s"], phases["cpu"]["pods_per_s"]
    gpu_bound = phases["gpu"]["bound"]
    return {
        "gpu_pods_per_s": gpu_rate, "cpu_pods_per_s": cpu_rate,
        "gpu_to_cpu": round(gpu_rate / cpu_rate, 3) if cpu_rate else None,
        "extender_cpu_ms_per_gpu_pod": round(1000 * phases["gpu"]["cpu_s"]["extender"] / gpu_bound, 2)
        if gpu_bound else None,
        "p99_latency_ms": {label: phases[label]["created_to_bound_ms"]["p99"] for label in phases},
        "p99_scheduling_sli_ms": {label: phases[label]["kube_scheduler"]["pod_scheduling_sli_duration"]["p99_ms"]
                                  for label in phases},
        "double_booked_cards": over, "wrong_assignments": wrong,
        "failed_binds": sum(phases[label]["kube_scheduler"]["attempts"].get("error", 0) for label in phases),
        "extender_bind_errors": sum(n for k, n in phases["gpu"]["extender_outcomes"].items()
                                    if k.startswith("bind:") and k != "bind:ok"),
        "forced_watch_closes": closes, "bench_watch_reconnects": watch.reconnects,
        "nodes": opts.nodes, "cards_per_node": 8, "gpu_pods": opts.gpu_pods, "cpu_pods": opts.cpu_pods,
        "gpu_bound": gpu_bound, "cpu_bound": phases["cpu"]["bound"], "running": running,
        "all_running_after_s": None if all_running_s is None else round(all_running_s, 2),
        "crds": list(parts.crds), "kwok": opts.kwok, "lease_duration_s": opts.lease_duration_s if opts.kwok else None,
        "node_timings_s": parts.nodes.timings,
        "scheduler_qps": opts.scheduler_qps, "scheduler_burst": opts.scheduler_burst,
        "policy": opts.policy, "seed": opts.seed, "mode": opts.mode,
        "extender_workload_profile": None if opts.fresh_profile else TRACE,
        "skipped_too_large": gpu.skipped_too_large + cpu.skipped_too_large,
        "kube_scheduler_series": "scheduling_algorithm_duration_seconds (filter+score incl. the extender's "
                                 "filter and prioritize), scheduling_attempt_duration_seconds{result=scheduled} "
                                 "(algorithm + binding: the extender's bind for GPU pods), "
                                 "pod_scheduling_sli_duration_seconds (queue entry to bound)",
        "load_average_1m_start": round(load_start, 2), "load_average_1m_end": round(os.getloadavg()[0], 2),
        "phases": phases,
    }


def table(result: dict[str, Any]) -> str:
    nodes = result["node_timings_s"]
    rows = [("nodes x cards", f"{result['nodes']} x {result['cards_per_node']} "
                              + (f"(KWOK, leases {result['lease_duration_s']} s; created in {nodes['create_s']} s, "
                                 f"Ready after {nodes['ready_s']} s)" if result["kwok"] else "(bare Node objects)")),
            ("mode (scheduler configuration)", result["mode"]),
            ("kube-scheduler client qps / burst", f"{result['scheduler_qps']:g} / {result['scheduler_burst']}")]
    for label in ("gpu", "cpu"):
        phase = result["phases"][label]
        ks = phase["kube_scheduler"]
        rows += [(f"{label}: pods bound / created", f"{phase['bound']} / {phase['pods']}"),
                 (f"{label}: pods/s (creation to bound)", f"{phase['pods_per_s']} ({phase['seconds']} s, "
                                                           f"creating took {phase['create_s']} s)"),
                 (f"{label}: created to bound p50 / p99 ms",
                  f"{phase['created_to_bound_ms']['p50']} / {phase['created_to_bound_ms']['p99']}"),
                 (f"{label}: kube-scheduler algorithm p50 / p99 ms",
                  f"{ks['scheduling_algorithm_duration']['p50_ms']} / {ks['scheduling_algorithm_duration']['p99_ms']}"),
                 (f"{label}: kube-scheduler attempt p50 / p99 ms",
                  f"{ks['scheduling_attempt_duration']['p50_ms']} / {ks['scheduling_attempt_duration']['p99_ms']}"),
                 (f"{label}: kube-scheduler SLI p50 / p99 ms",
                  f"{ks['pod_scheduling_sli_duration']['p50_ms']} / {ks['pod_scheduling_sli_duration']['p99_ms']}"),
                 (f"{label}: schedule attempts", json.dumps(ks["attempts"])),
                 (f"{label}: Running when bound (KWOK) / p50 ms later",
                  f"{phase['running_when_bound']} / {phase['bound_to_running_ms']['p50']}"),
                 (f"{label}: extender handler ms", json.dumps(phase["extender_ms"])),
                 (f"{label}: cycle seen by the extender ms", json.dumps(phase["cycle_ms"])),
                 (f"{label}: extender loop thread per request ms", json.dumps(phase["extender_loop_ms"])),
                 (f"{label}: CPU s", json.dumps(phase["cpu_s"]))]
    rows += [("gpu / cpu pods/s", str(result["gpu_to_cpu"])),
             ("extender CPU ms per GPU pod", str(result["extender_cpu_ms_per_gpu_pod"])),
             ("double-booked cards / wrong assignments / failed binds",
              f"{result['double_booked_cards']} / {result['wrong_assignments']} / {result['failed_binds']}"),
             ("pods Running at the end", f"{result['running']} (all after {result['all_running_after_s']} s)"),
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
    p.add_argument("--kwok", action=argparse.BooleanOptionalAction, default=True,
                   help="KWOK simulates the nodes (Ready, Leases, pods Running); --no-kwok: bare Node objects")
    p.add_argument("--lease-duration-s", type=int, default=40,
                   help="the nodes' Lease duration under KWOK, renewed every quarter of it (a kubelet's: 40)")
    p.add_argument("--policy", default="gpupool", help="the extender's --policy")
    p.add_argument("--mode", choices=sorted(SHIPPED_CONFIGS), default="best-only",
                   help="the shipped scheduler configuration (best-only: no prioritizeVerb, the extender's "
                        "--filter-best-only; prioritize: the -prioritize.yaml variant, --no-filter-best-only)")
    p.add_argument("--filter-all-best", action="store_true",
                   help="the extender's --filter-all-best: every best node passed, kube-scheduler's plugins choose")
    p.add_argument("--scheduler-qps", type=float, default=DEFAULT_QPS)
    p.add_argument("--scheduler-burst", type=int, default=DEFAULT_BURST)
    p.add_argument("--create-threads", type=int, default=16)
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds a phase may take to bind its pods (and the nodes to be Ready)")
    p.add_argument("--max-cpu-share", type=float, default=0.7,
                   help="refuse pod counts whose CPU requests pass this share of the nodes' CPU")
    p.add_argument("--pprof-dir", default=None,
                   help="save a CPU profile of kube-scheduler per phase here (kube-scheduler-<phase>.pprof)")
    p.add_argument("--pprof-seconds", type=int, default=15, help="length of each profile, from the phase's start")
    p.add_argument("--profile-extender", default=None,
                   help="write cProfile stats of the extender's event loop (both phases) to this file")
    p.add_argument("--fresh-profile", action="store_true",
                   help="leave the extender the profile it makes at start (no pods: every node scores alike)")
    p.add_argument("--keep-state", action="store_true", help="keep the cluster's state directory (its logs) at the end")
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
