"""The processes around ``bench/reclaim.py``'s node: ``gpupool extender``, ``gpupool node-agent`` and
kube-scheduler with the shipped configuration, each a child process with its log in the bench's
work directory, started as deployed (the CLI, a kubeconfig, flags).

The end-to-end tests run the same components with their own helpers (``tests/e2e``); a benchmark
imports nothing from ``tests/``, so that ``python3 bench/reclaim.py`` runs from a checkout as it is.
The control plane, the kubelet and the process plumbing are :mod:`gpupool.testenv`'s.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml

from gpupool.testenv.containerd import DeviceNode
from gpupool.testenv.controlplane import ControlPlane, scheduler_args
from gpupool.testenv.kubelet import Kubelet
from gpupool.testenv.paths import Binaries
from gpupool.testenv.ports import free_ports
from gpupool.testenv.probe import is_ok
from gpupool.testenv.procs import ManagedProcess, spawn, wait_until

REPO = Path(__file__).resolve().parents[1]
SCHEDULER_CONFIG = REPO / "deploy" / "scheduler-config-v1-prioritize.yaml"
GPUPOOL_CLI = [sys.executable, "-c", "from gpupool.cli.main import main; main()"]
"""The ``gpupool`` command of this checkout (with ``PYTHONPATH`` at :data:`REPO`)."""
CONTROL_NODES = tuple(DeviceNode(p, 1, 3) for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"))
"""The NVIDIA control devices every gpupool grant lists, as stand-ins with ``/dev/null``'s numbers:
the runtime only has to be able to create them in the container."""


def _gpupool(name: str, args: list[str], log_path: Path) -> ManagedProcess:
    return spawn(name, [*GPUPOOL_CLI, *args], log_path, executable=Path(sys.executable),
                 env={**os.environ, "PYTHONPATH": str(REPO)})


class Extender:
    """``gpupool extender`` on a free loopback port, plain HTTP, leader of its own lease."""

    def __init__(self, kubeconfig: Path, log_path: Path) -> None:
        self.kubeconfig, self.log_path = kubeconfig, log_path
        (self.port,) = free_ports(1)
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it and wait until ``/readyz`` answers (its caches have listed the cluster)."""
        self.process = _gpupool("gpupool-extender", [
            "extender", "--host", "127.0.0.1", "--port", str(self.port), "--kubeconfig", str(self.kubeconfig),
            "--policy", "binpack", "--lease-namespace", "default", "--identity", "reclaim-bench-extender",
            "--unconfirmed-timeout", "600"], self.log_path)
        wait_until(lambda: is_ok(f"{self.url}/readyz"), what="gpupool extender ready", timeout=60,
                   watch=[self.process])

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class NodeAgent:
    """``gpupool node-agent --fake-gpus`` for one test-environment kubelet, pointed at its host-side
    device-plugin directory and PodResources socket, as a DaemonSet would mount them."""

    def __init__(self, kubelet: Kubelet, kubeconfig: Path, gpus_yaml: str, workdir: Path,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.kubelet, self.kubeconfig, self.workdir, self.extra_args = kubelet, kubeconfig, workdir, extra_args
        (workdir / "gpus.yaml").write_text(gpus_yaml)
        self.log_path = workdir / "node-agent.log"
        self.process: ManagedProcess | None = None

    def start(self) -> None:
        (metrics_port,) = free_ports(1)  # not the default: the machine's own agent may hold it
        self.process = _gpupool("gpupool-node-agent", [
            "node-agent", "--node-name", self.kubelet.node_name, "--fake-gpus", str(self.workdir / "gpus.yaml"),
            "--plugin-dir", str(self.kubelet.device_plugin_dir),
            "--pod-resources-socket", str(self.kubelet.pod_resources_socket), "--kubeconfig", str(self.kubeconfig),
            "--metrics-port", str(metrics_port), "--usage-state-file", str(self.workdir / "usage-state.json"),
            *self.extra_args], self.log_path)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=10)

    def log(self, chars: int = 3000) -> str:
        """The end of its log, for failure messages."""
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else "(no log)"


def run_scheduler(binaries: Binaries, plane: ControlPlane, workdir: Path, extender_url: str,
                  scheduler_name: str) -> ManagedProcess:
    """kube-scheduler with :data:`SCHEDULER_CONFIG`, only its connection details replaced: the
    kubeconfig, the extender's URL (plain HTTP here), no leader election, and a scheduler name of
    its own (the control plane may run another scheduler)."""
    config: dict[str, Any] = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    config["clientConnection"]["kubeconfig"] = str(plane.kubeconfig)
    config["leaderElection"] = {"leaderElect": False}
    config["profiles"] = [{**profile, "schedulerName": scheduler_name} for profile in config.get("profiles") or [{}]]
    (entry,) = config["extenders"]
    entry["urlPrefix"] = extender_url
    entry["enableHTTPS"] = extender_url.startswith("https://")
    entry.pop("tlsConfig", None)
    path = workdir / f"{scheduler_name}.yaml"
    path.write_text(yaml.safe_dump(config))
    (healthz_port,) = free_ports(1)
    process = spawn("kube-scheduler", [binaries.kube_scheduler,
                                       *scheduler_args(config=path, kubeconfig=plane.kubeconfig, port=healthz_port)],
                    workdir / f"{scheduler_name}.log")
    wait_until(lambda: is_ok(f"https://127.0.0.1:{healthz_port}/healthz", verify=False),
               what="kube-scheduler with the shipped configuration", timeout=60, watch=[process])
    return process
