"""The test environment's kube-scheduler (the current release) for bench/e2e_scheduling.py: the
shipped configuration, started, and what it measures about itself (``/metrics``).

The configuration is a shipped v1 file (:data:`SHIPPED_CONFIGS`: extender verbs, weight,
``nodeCacheCapable``, ``managedResources``, ``httpTimeout``, ``percentageOfNodesToScore: 100``),
with only what a test cluster must change: the kubeconfig, the extender's URL (plain HTTP, without
the shipped client certificate), no leader election (one scheduler), health and metrics on a
loopback secure port (read with the admin token), and the client's ``qps``/``burst``, which the
bench sets explicitly so that both phases run under the same limit (every Binding kube-scheduler
posts itself, i.e. every CPU-only pod, waits for that limiter; the extender binds GPU pods with its
own client).

What kube-scheduler v1.37 measures (``pkg/scheduler/metrics/metrics.go``; no series per extender,
and ``scheduler_binding_duration_seconds`` and ``scheduler_e2e_scheduling_duration_seconds`` are
gone from current releases):

* ``scheduler_scheduling_algorithm_duration_seconds``: one scheduling cycle's filter and score,
  the extender's ``filter`` and ``prioritize`` round trips included;
* ``scheduler_scheduling_attempt_duration_seconds{result="scheduled"}``: the algorithm and the
  binding cycle (the extender's ``bind`` round trip for a GPU pod, kube-scheduler's own Binding
  POST otherwise), from the start of the cycle; so attempt minus algorithm is about the binding;
* ``scheduler_pod_scheduling_sli_duration_seconds``: from the pod's entry into the active queue
  to its binding, its wait in the queue included (the scheduling SLI);
* ``scheduler_schedule_attempts_total{result}``: scheduled, unschedulable, error (a failed bind
  counts as error).

Histograms have buckets of 1 ms x 2^k (the SLI's: 10 ms x 2^k); quantiles are interpolated within
a bucket as Prometheus's ``histogram_quantile`` does, so they are coarse (a factor of two per bucket).
"""

from __future__ import annotations

import math
import ssl
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpupool.testenv.controlplane import scheduler_args
from gpupool.testenv.paths import Binaries
from gpupool.testenv.probe import is_ok
from gpupool.testenv.procs import ManagedProcess, spawn, wait_until

REPO = Path(__file__).resolve().parents[1]
SHIPPED_CONFIG = REPO / "deploy" / "scheduler-config-v1.yaml"
SHIPPED_CONFIGS = {"best-only": SHIPPED_CONFIG,
                   "prioritize": REPO / "deploy" / "scheduler-config-v1-prioritize.yaml"}
"""The shipped v1 configuration of each mode: filter (the extender's --filter-best-only) and
bind, the default; or filter, prioritize and bind (the extender's --no-filter-best-only)."""

ALGORITHM = "scheduler_scheduling_algorithm_duration_seconds"
ATTEMPT = "scheduler_scheduling_attempt_duration_seconds"
SLI = "scheduler_pod_scheduling_sli_duration_seconds"
ATTEMPTS = "scheduler_schedule_attempts_total"
HISTOGRAMS = (ALGORITHM, ATTEMPT, SLI)


def scheduler_config(kubeconfig: Path, extender_url: str, qps: float, burst: int,
                     shipped: Path = SHIPPED_CONFIG) -> str:
    """The shipped v1 configuration with the test cluster's kubeconfig, URL and limits."""
    config: dict[str, Any] = yaml.safe_load(shipped.read_text())
    config["clientConnection"] = {**config.get("clientConnection", {}), "kubeconfig": str(kubeconfig),
                                  "qps": qps, "burst": burst}
    config["leaderElection"] = {"leaderElect": False}
    (extender,) = config["extenders"]
    extender["urlPrefix"] = extender_url
    if extender_url.startswith("http://"):  # the bench's extender serves plain HTTP: no client certificate
        extender.pop("enableHTTPS", None)
        extender.pop("tlsConfig", None)
    return yaml.safe_dump(config, sort_keys=False)


@dataclass
class Scheduler:
    """A running kube-scheduler, the address of its secure port and the token that may read it."""

    process: ManagedProcess
    address: str
    token: str

    def _get(self, path: str, timeout: float) -> bytes:
        request = urllib.request.Request(f"https://{self.address}{path}",
                                         headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout, context=_LOOPBACK_TLS) as answer:
            body: bytes = answer.read()
        return body

    def scrape(self) -> dict[str, Any]:
        """The series this bench reads, keyed ``name`` or ``name{label=value,...}``."""
        return parse(self._get("/metrics", 30).decode())

    def cpu_profile(self, seconds: int, path: Path) -> threading.Thread:
        """Save a CPU profile of the next ``seconds`` (Go's pprof; ``enableProfiling`` is on by
        default) to ``path``, from a thread of its own; read it with ``go tool pprof``."""
        def fetch() -> None:
            path.write_bytes(self._get(f"/debug/pprof/profile?seconds={seconds}", seconds + 60))

        thread = threading.Thread(target=fetch, name="bench-pprof", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.process.stop()


#: kube-scheduler's serving certificate is one it made up at start; the bench reads it on loopback.
_LOOPBACK_TLS = ssl._create_unverified_context()


def start_scheduler(binaries: Binaries, state_dir: Path, config_text: str, port: int, *, kubeconfig: Path,
                    token: str, timeout: float = 60.0) -> Scheduler:
    config = state_dir / "kube-scheduler-bench.yaml"
    config.write_text(config_text)
    process = spawn("kube-scheduler", [binaries.kube_scheduler,
                                       *scheduler_args(config=config, kubeconfig=kubeconfig, port=port)],
                    state_dir / "logs" / "kube-scheduler-bench.log")
    address = f"127.0.0.1:{port}"
    wait_until(lambda: is_ok(f"https://{address}/healthz", verify=False), what="kube-scheduler /healthz",
               timeout=timeout, watch=[process])
    return Scheduler(process, address, token)


def parse(text: str) -> dict[str, Any]:
    """The bench's histograms (``result="scheduled"`` only, profiles summed) as ``{"buckets": [(le,
    cumulative count)], "sum", "count"}``, and the schedule attempts as ``attempts:<result>``."""
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        if family.type == "histogram" and family.name in HISTOGRAMS:
            buckets: dict[float, float] = {}
            entry: dict[str, Any] = {"sum": 0.0, "count": 0.0}
            for sample in family.samples:
                if sample.labels.get("result", "scheduled") != "scheduled":
                    continue
                if sample.name.endswith("_bucket"):
                    le = float(sample.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + sample.value
                elif sample.name.endswith("_sum"):
                    entry["sum"] += sample.value
                elif sample.name.endswith("_count"):
                    entry["count"] += sample.value
            out[family.name] = {**entry, "buckets": sorted(buckets.items())}
        for sample in family.samples:
            if sample.name == ATTEMPTS:
                key = f"attempts:{sample.labels.get('result')}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def histogram_delta(after: dict[str, Any], before: dict[str, Any], name: str) -> dict[str, Any]:
    """What a histogram observed between two scrapes."""
    now = after.get(name, {"buckets": [], "sum": 0.0, "count": 0.0})
    then = before.get(name, {"buckets": [], "sum": 0.0, "count": 0.0})
    earlier = dict(then["buckets"])
    return {"buckets": [(le, count - earlier.get(le, 0.0)) for le, count in now["buckets"]],
            "sum": now["sum"] - then["sum"], "count": now["count"] - then["count"]}


def quantile(histogram: dict[str, Any], q: float) -> float | None:
    """Prometheus's ``histogram_quantile``: linear within the bucket that holds the q-th observation."""
    buckets = sorted(histogram["buckets"])
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            span = count - below
            return float(lower + (upper - lower) * ((rank - below) / span if span > 0 else 0.0))
        lower, below = upper, count
    return lower


def summary_ms(histogram: dict[str, Any]) -> dict[str, float | None]:
    """p50, p99 and mean in milliseconds, and the number of observations."""
    count = histogram["count"]
    p50, p99 = quantile(histogram, 0.5), quantile(histogram, 0.99)
    return {"p50_ms": None if p50 is None else round(1000 * p50, 2),
            "p99_ms": None if p99 is None else round(1000 * p99, 2),
            "mean_ms": round(1000 * histogram["sum"] / count, 2) if count else None,
            "count": int(count)}
