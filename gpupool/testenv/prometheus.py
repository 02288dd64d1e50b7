"""A real Prometheus for the monitoring tests: Debian's ``prometheus`` package, run as a child.

Installed like the container runtime's Debian packages (:mod:`gpupool.testenv.runtime_tools`):
with ``apt-get``, only when ``/usr/bin/prometheus`` is missing, only as root. The package's own
service is not used (it may or may not have been started by the package's scripts, depending on the
machine's policy): :class:`PrometheusProcess` runs the binary with its own configuration, a
throw-away data directory and a free loopback port, and the tests talk to its HTTP API.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from gpupool.testenv.errors import BuildImpossibleError
from gpupool.testenv.paths import cache_dir
from gpupool.testenv.procs import ManagedProcess, spawn, wait_until
from gpupool.testenv.steps import Log, apt_install, exclusive_lock, quiet, run_step

PACKAGE = "prometheus"
DEBIAN_BINARY = Path("/usr/bin/prometheus")
READY_TIMEOUT_S = 60.0


def find_prometheus() -> Path | None:
    """Debian's prometheus binary (``which`` first), or None."""
    found = shutil.which("prometheus")
    if found:
        return Path(found)
    return DEBIAN_BINARY if DEBIAN_BINARY.exists() else None


def prometheus_impossible_reason() -> str | None:
    """Why Prometheus can be neither found nor installed here; None when it can."""
    if find_prometheus() is not None:
        return None
    if shutil.which("apt-get") is None:
        return "prometheus is not installed and there is no apt-get to install Debian's package"
    if os.geteuid() != 0:
        return "prometheus is not installed and not running as root, so cannot apt-get install it"
    return None


def ensure_prometheus(log: Log = quiet) -> Path:
    """The prometheus binary, installing Debian's package first when it is missing.

    Raises :class:`BuildImpossibleError` (tests skip with its message) when it cannot be installed
    here: not root, no apt-get, or apt-get failing even after refreshing its lists.
    """
    reason = prometheus_impossible_reason()
    if reason is not None:
        raise BuildImpossibleError(reason)
    found = find_prometheus()
    if found is not None:
        return found
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache_dir() / ".prometheus-install.lock", log):
        if find_prometheus() is None:
            apt_install((PACKAGE,), "prometheus", logs, log, run=run_step)
    found = find_prometheus()
    if found is None:
        raise BuildImpossibleError(f"apt-get installed {PACKAGE} but no prometheus binary is on PATH "
                                   f"or at {DEBIAN_BINARY}")
    return found


def static_config(jobs: dict[str, list[str]], interval_s: float = 1.0) -> dict[str, Any]:
    """A Prometheus configuration scraping ``host:port`` targets, one job per key."""
    interval = f"{max(1, round(interval_s * 1000))}ms"
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [{"job_name": job, "metrics_path": "/metrics",
                                "static_configs": [{"targets": targets}]} for job, targets in jobs.items()]}


class PrometheusProcess:
    """``prometheus`` as a child process with its own configuration and data directory."""

    def __init__(self, binary: Path, workdir: Path, config: dict[str, Any], port: int) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = port
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(json.dumps(config))  # JSON is YAML
        self.log_path = workdir / "prometheus.log"
        self.proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start and wait for ``/-/ready``."""
        cmd = [str(self.binary), f"--config.file={self.config_path}",
               f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
               "--storage.tsdb.retention.time=1h", "--log.level=warn"]
        self.proc = spawn("prometheus", cmd, self.log_path, cwd=self.workdir)
        wait_until(self._ready, what="prometheus /-/ready", timeout=READY_TIMEOUT_S, watch=[self.proc])

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
            return bool(resp.status == 200)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout=10.0)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else "(no log)"

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>`` with ``params``; the ``data`` of a successful answer."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"prometheus refused {path} {params}: {exc.read().decode(errors='replace')}") \
                from exc
        if answer.get("status") != "success":
            raise AssertionError(f"prometheus answered {path} {params} with {answer}")
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (scalars and strings come back as a one-item list)."""
        data = self.api("query", query=expr)
        result = data["result"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": result}]
        return list(result)

    def targets_up(self) -> dict[str, str]:
        """Scrape URL → health of every active target."""
        data = self.api("targets", state="active")
        return {t["scrapeUrl"]: t["health"] for t in data["activeTargets"]}
