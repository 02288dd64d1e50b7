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
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpupool-extender"


def serve(kubeconfig: str, port: int, identity: str, policy: str, profile: str | None = None) -> None:
    """Child process: ``gpupool extender`` with per-request timings (blocks until killed).

    ``profile``: run cProfile on the event loop's thread (filter, prioritize, the bind's HTTP side;
    not the bind threads or the watches) and write its stats there on exit.
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
                              identity=identity)
    configuration = api_configuration(kubeconfig)
    configuration.connection_pool_maxsize = 32  # as gpupool extender's own client: binds run on a pool
    api_client = client.ApiClient(configuration)
    replica = start_replica(options, client.CoreV1Api(api_client), client.CoordinationV1Api(api_client))
    replica.housekeeping.start(replica.stop)
    metrics = TimedMetrics()
    app = ExtenderApi(replica.service, ResourceNames(), metrics).app()

    async def timings(request: web.Request) -> web.Response:
        body = orjson.dumps({"ms": metrics.ms, "outcomes": metrics.outcomes, "stamps": metrics.stamps})
        if request.query.get("reset"):
            metrics.ms.clear()
            metrics.outcomes.clear()
            metrics.stamps.clear()
        return web.Response(body=body, content_type="application/json")

    app.router.add_get("/bench/timings", timings)
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    try:
        web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)
    finally:
        replica.shutdown()
        if profiler is not None and profile:
            profiler.disable()
            profiler.dump_stats(profile)


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
                 identity: str = "bench-extender", profile: Path | None = None) -> None:
        self.port = port
        self.identity = identity
        self.log_path = log_path
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        argv = [sys.executable, "-m", "bench.e2e_extender", "--kubeconfig", str(kubeconfig),
                "--port", str(port), "--identity", identity, "--policy", policy]
        if profile is not None:
            argv += ["--profile", str(profile)]
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
        """Until ``/readyz`` answers (the cache has synced) and ``lease_holder()`` names this replica."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"extender exited ({self.proc.returncode}); log {self.log_path}:\n"
                                   f"{self.log_path.read_text(errors='replace')[-3000:]}")
            try:
                if self.get("/readyz") == b"ok" and lease_holder() == self.identity:
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
    opts = parser.parse_args()
    serve(opts.kubeconfig, opts.port, opts.identity, opts.policy, opts.profile)


if __name__ == "__main__":
    main()
