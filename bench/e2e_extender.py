"""The extender of bench/e2e_scheduling.py: ``gpupool extender``'s wiring in a child process, plus
the handlers' own duration of every request, per verb.

The child runs exactly what ``gpupool extender`` runs (:func:`gpupool.cli.extender_cmd.start_replica`:
watches, leader election, the bind fence, housekeeping; the same aiohttp app), with one difference:
its metrics also keep each request's duration, from the handler's entry to its answer (what
``gpupool_extender_request_seconds`` observes) with its start and end on the machine's monotonic
clock, and ``GET /bench/timings`` hands them back (and clears them with ``?reset=1``). The
Prometheus histogram's buckets (0.5, 1, 2.5, 5 ms ...) are too coarse for a p50 of a few ms.

    python3 -m bench.e2e_extender --kubeconfig K --port 8888 --identity bench
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import os
import pstats
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpupool-extender"


_SCHEDSTAT_FDS: dict[int, int] = {}
"""Per thread, its ``schedstat`` file kept open: the middleware reads it four times per request on
the event loop, and an open and close each time was ~0.1 ms of the loop's CPU per pod."""


def thread_schedstat() -> tuple[float, float]:
    """Seconds this thread has run on a CPU and waited in a run queue for one (``/proc/thread-self/
    schedstat``); (0, 0) where the kernel does not keep them."""
    tid = threading.get_native_id()
    try:
        fd = _SCHEDSTAT_FDS.get(tid)
        if fd is None:
            fd = _SCHEDSTAT_FDS[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        ran, waited, _ = os.pread(fd, 128, 0).split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(ran) / 1e9, int(waited) / 1e9


def thread_cpu_s(pid: int, tid: int) -> float:
    """User + system CPU seconds of one thread (``/proc/<pid>/task/<tid>/stat``), 0 where unreadable.

    The extender's event loop runs on its main thread (tid = pid): filter, prioritize and the HTTP
    side of every request; binds, watches and housekeeping run on other threads."""
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def install_workload(replica: Any, trace: str) -> None:
    """Score against the workload profile of ``trace``'s pods once housekeeping has made its first
    profile (of the pods known at start: none in a fresh bench cluster, which leaves a
    fragmentation policy scoring every node alike until its next refresh, minutes later).

    The profile is what :meth:`ClusterCache.refresh_profile` computes once pods of that trace run
    in the cluster; the bench's pods are drawn from it.
    """
    from gpupool.core.fragmentation import WorkloadProfile
    from gpupool.core.policies import make_policy
    from gpupool.core.scheduler import Scheduler
    from gpupool.extender.gc_freeze import freeze_long_lived
    from gpupool.sim.trace import load_pods, resolve_trace

    profile = WorkloadProfile.from_pods([p.request for p in load_pods(resolve_trace(trace))])
    while not replica.housekeeping.profiled:
        time.sleep(0.1)
    cache = replica.cache
    with cache.lock:
        cache.profile = profile
        cache.scheduler = Scheduler(cache.state, make_policy(cache.policy_name), profile=profile)
    freeze_long_lived()
    logging.getLogger("bench").info("scoring against the workload profile of trace %s", trace)


def profile_new_threads() -> list[cProfile.Profile]:
    """Run cProfile (CPU time) on every thread started from now on (the watches, the bind pool);
    their profiles, to merge at the end (``<profile>.threads``). ``threading.setprofile`` hands each
    new thread a hook whose first call swaps itself for that thread's own profiler."""
    profiles: list[cProfile.Profile] = []

    def start(_frame: Any, _event: str, _arg: Any) -> None:
        thread_profiler = cProfile.Profile(time.thread_time)
        profiles.append(thread_profiler)
        thread_profiler.enable()

    threading.setprofile(start)
    return profiles


def serve(kubeconfig: str, port: int, identity: str, policy: str, profile: str | None = None,
          workload: str | None = None, filter_best_only: bool = False, filter_one_best: bool = True) -> None:
    """Child process: ``gpupool extender`` with per-request timings (blocks until killed).

    ``profile``: run cProfile (CPU time) on the event loop's thread (filter, prioritize, the bind's HTTP side)
    and write its stats there on exit; the other threads' (bind pool, watches) go to ``<profile>.threads``.
    ``workload``: a trace whose workload profile the policy scores against (:func:`install_workload`); ``/bench/ready``
    answers 200 once it is in place. ``filter_best_only``: ``gpupool extender --filter-best-only``;
    ``filter_one_best``: its ``--filter-one-best`` (the default) or ``--filter-all-best``.
    """
    import orjson
    from aiohttp import web
    from kubernetes import client

    from gpupool.api.names import ResourceNames
    from gpupool.cli.extender_cmd import ExtenderOptions, start_replica
    from gpupool.extender.http.api import ExtenderApi
    from gpupool.extender.metrics import ExtenderMetrics
    from gpupool.kube.client_config import api_configuration

    class TimedMetrics(ExtenderMetrics):
        def __init__(self) -> None:
            super().__init__()
            self.ms: dict[str, list[float]] = defaultdict(list)
            self.outcomes: dict[str, int] = defaultdict(int)

            self.stamps: list[tuple[str, float, float]] = []

        def observe(self, verb: str, outcome: str, seconds: float) -> None:
            super().observe(verb, outcome, seconds)
            end = time.monotonic()  # CLOCK_MONOTONIC: the same clock in every process of this machine
            self.ms[verb].append(seconds * 1000)
            self.outcomes[f"{verb}:{outcome}"] += 1
            self.stamps.append((verb, end - seconds, end))

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = ExtenderOptions(host="127.0.0.1", port=port, kubeconfig=kubeconfig, policy=policy,
                              identity=identity, filter_best_only=filter_best_only, filter_one_best=filter_one_best)
    thread_profiles = profile_new_threads() if profile else []
    configuration = api_configuration(kubeconfig)
    configuration.connection_pool_maxsize = 32  # as gpupool extender's own client: binds run on a pool
    api_client = client.ApiClient(configuration)
    replica = start_replica(options, client.CoreV1Api(api_client), client.CoordinationV1Api(api_client))
    replica.housekeeping.start(replica.stop)
    metrics = TimedMetrics()
    metrics.watch_ledger(replica.cache)
    app = ExtenderApi(replica.service, ResourceNames(), metrics, requests=replica.cache.requests).app()

    spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])

    @web.middleware
    async def account(request: web.Request, handler: Any) -> Any:
        """Split each request's handling on the loop's thread into CPU, waiting for a CPU, and the rest."""
        before, started = thread_schedstat(), time.monotonic()
        try:
            return await handler(request)
        finally:
            after, ended = thread_schedstat(), time.monotonic()
            total = spent[request.path.rsplit("/", 1)[-1]]
            total[0] += ended - started
            total[1] += after[0] - before[0]
            total[2] += after[1] - before[1]
            total[3] += 1

    app.middlewares.append(account)

    async def timings(request: web.Request) -> web.Response:
        body = orjson.dumps({"ms": metrics.ms, "outcomes": metrics.outcomes, "stamps": metrics.stamps,
                            "spent": spent})
        if request.query.get("reset"):
            metrics.ms.clear()
            metrics.outcomes.clear()
            metrics.stamps.clear()
            spent.clear()
        return web.Response(body=body, content_type="application/json")

    installed = threading.Event()

    def install() -> None:
        if workload:
            install_workload(replica, workload)
        installed.set()

    async def ready(_request: web.Request) -> web.Response:
        return web.Response(status=200 if installed.is_set() else 503)

    app.router.add_get("/bench/timings", timings)
    app.router.add_get("/bench/ready", ready)
    threading.Thread(target=install, name="bench-workload", daemon=True).start()
    profiler = cProfile.Profile(time.thread_time) if profile else None  # CPU time: waits are not work
    if profiler is not None:
        profiler.enable()
    try:
        web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)
    finally:
        replica.shutdown()
        if profiler is not None and profile:
            profiler.disable()
            profiler.dump_stats(profile)
            if thread_profiles:
                pstats.Stats(*thread_profiles).dump_stats(f"{profile}.threads")


def handler_split(spent: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per verb, the mean ms a request spent in its handler on the event loop's thread: ``wall``,
    of which ``cpu`` running, ``run_queue`` waiting for a CPU (the machine is busy), and ``other``
    neither: the thread slept, i.e. waited for the interpreter lock, which a bind or watch thread held
    (a bind's own wait for its thread pool shows here too)."""
    out = {}
    for verb, (wall, cpu, queued, count) in sorted(spent.items()):
        if count:
            out[verb] = {"wall": round(1000 * wall / count, 2), "cpu": round(1000 * cpu / count, 2),
                         "run_queue": round(1000 * queued / count, 2),
                         "other": round(1000 * (wall - cpu - queued) / count, 2)}
    return out


CYCLE_PARTS = ("filter", "filter_to_prioritize", "prioritize", "prioritize_to_next_filter", "cycle")


def cycle_breakdown(stamps: list[tuple[str, float, float]]) -> dict[str, dict[str, float]]:
    """kube-scheduler's scheduling cycle of a GPU pod, seen from the extender, in ms (median, mean).

    kube-scheduler runs one cycle at a time: filter, then prioritize (skipped when one node passed),
    then the next pod's filter; binds run beside. So between the extender's answer to filter and
    the prioritize request lie the answer's transfer, kube-scheduler's decoding and its own score
    plugins; between the answer to prioritize and the next filter, the rest of that cycle and the
    next pod's filter plugins. ``cycle`` is from one filter to the next.
    """
    calls = sorted((start, end, verb) for verb, start, end in stamps if verb in ("filter", "prioritize"))
    parts: dict[str, list[float]] = {name: [] for name in CYCLE_PARTS}
    for i, (start, end, verb) in enumerate(calls):
        if verb != "filter":
            continue
        parts["filter"].append(end - start)
        following = calls[i + 1] if i + 1 < len(calls) else None
        if following is None:
            continue
        if following[2] == "prioritize":
            parts["filter_to_prioritize"].append(following[0] - end)
            parts["prioritize"].append(following[1] - following[0])
            after = calls[i + 2] if i + 2 < len(calls) else None
            if after is not None and after[2] == "filter":
                parts["prioritize_to_next_filter"].append(after[0] - following[1])
                parts["cycle"].append(after[0] - start)
        else:
            parts["cycle"].append(following[0] - start)
    return {name: {"p50": round(1000 * statistics.median(v), 2), "mean": round(1000 * statistics.fmean(v), 2)}
            for name, v in parts.items() if v}


class BenchExtender:
    """The child process seen from the bench: start, readiness, leadership, timings, stop."""

    def __init__(self, kubeconfig: Path, port: int, log_path: Path, policy: str = "gpupool",
                 identity: str = "bench-extender", profile: Path | None = None,
                 workload: str | None = None, filter_best_only: bool = False, filter_one_best: bool = True) -> None:
        self.port = port
        self.identity = identity
        self.log_path = log_path
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        argv = [sys.executable, "-m", "bench.e2e_extender", "--kubeconfig", str(kubeconfig),
                "--port", str(port), "--identity", identity, "--policy", policy]
        if profile is not None:
            argv += ["--profile", str(profile)]
        if workload is not None:
            argv += ["--workload", workload]
        if filter_best_only:
            argv.append("--filter-best-only")
        if not filter_one_best:
            argv.append("--filter-all-best")
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=REPO, env=env, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=30) as answer:
            data: bytes = answer.read()
            return data

    def wait_ready(self, lease_holder: Any, timeout: float = 120.0) -> None:
        """Until ``/readyz`` answers (the cache has synced), the workload profile is in place and
        ``lease_holder()`` names this replica."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"extender exited ({self.proc.returncode}); log {self.log_path}:\n"
                                   f"{self.log_path.read_text(errors='replace')[-3000:]}")
            try:
                if (self.get("/readyz") == b"ok" and self.get("/bench/ready") == b""
                        and lease_holder() == self.identity):
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"extender not ready and leading after {timeout:.0f} s; log {self.log_path}")

    def timings(self, reset: bool = False) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.get("/bench/timings" + ("?reset=1" if reset else "")))
        return doc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--identity", default="bench-extender")
    parser.add_argument("--policy", default="gpupool")
    parser.add_argument("--profile", default=None, help="write cProfile stats of the event loop's thread here")
    parser.add_argument("--workload", default=None, help="score against this trace's workload profile")
    parser.add_argument("--filter-best-only", action="store_true", help="as gpupool extender --filter-best-only")
    parser.add_argument("--filter-all-best", action="store_true", help="as gpupool extender --filter-all-best")
    opts = parser.parse_args()
    serve(opts.kubeconfig, opts.port, opts.identity, opts.policy, opts.profile, opts.workload,
          opts.filter_best_only, not opts.filter_all_best)


if __name__ == "__main__":
    main()
