"""The shipped v1 scheduler configuration with prioritize, run by the real, current kube-scheduler.

kube-scheduler refuses a configuration it cannot read (it exits), so starting it with
deploy/scheduler-config-v1-prioritize.yaml proves the file is valid for the release under test (the default file,
without prioritize, runs in tests/bench/test_e2e_scheduling_smoke.py). The test then shows what the
file is for: the extender prefers a busy node by the least step it can express (10 against 9), and
kube-scheduler's NodeResourcesLeastAllocated prefers the idle one; with the file's weight the
extender's choice stands, with the weight the file used to have (5) the plugin's wins.

Only the connection details are changed for the test: the kubeconfig, the health port, the
extender's URL (a small server here), leader election off, and a scheduler name of its own (the
control plane's scheduler keeps serving every other test).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpupool.testenv.controlplane import ControlPlane, scheduler_args
from gpupool.testenv.paths import Binaries
from gpupool.testenv.ports import free_ports
from gpupool.testenv.probe import is_ok
from gpupool.testenv.procs import spawn, wait_until
from tests.e2e.e2e_support import MakeNode, pod_manifest, wait_for

pytestmark = pytest.mark.e2e

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "scheduler-config-v1-prioritize.yaml"
GPU_MEM = "gpupool.io/gpu-mem"
SMALL_NODE = {"cpu": "8", "memory": "8Gi", "pods": "110"}
PRE_CONFIG_WEIGHT = 5
"""The extender weight deploy/ shipped before the configuration was tuned for placement."""


class PreferringExtender(ThreadingHTTPServer):
    """Passes ``nodes``, scores ``preferred`` 10 and the others 9, and binds through the API."""

    def __init__(self, core_v1: client.CoreV1Api) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.core_v1 = core_v1
        self.nodes: set[str] = set()
        self.preferred = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/gpupool"


class _Handler(BaseHTTPRequestHandler):
    server: PreferringExtender

    def do_POST(self) -> None:
        args: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        verb = self.path.rsplit("/", 1)[1]
        answer: Any
        if verb == "filter":
            names = list(args.get("NodeNames") or [])
            answer = {"NodeNames": [n for n in names if n in self.server.nodes],
                      "FailedNodes": {n: "not in this test" for n in names if n not in self.server.nodes},
                      "Error": ""}
        elif verb == "prioritize":
            answer = [{"Host": n, "Score": 10 if n == self.server.preferred else 9}
                      for n in args.get("NodeNames") or []]
        else:
            body = {"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": args["PodName"], "uid": args["PodUID"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]}}
            self.server.core_v1.create_namespaced_binding(args["PodNamespace"], body, _preload_content=False)
            answer = {"Error": ""}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def extender(core_v1: client.CoreV1Api) -> Iterator[PreferringExtender]:
    server = PreferringExtender(core_v1)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def run_scheduler(binaries: Binaries, plane: ControlPlane, workdir: Path, extender_url: str,
                  scheduler_name: str, weight: int | None = None) -> Any:
    """kube-scheduler with the shipped file, connection details replaced (see the module doc)."""
    config = yaml.safe_load(CONFIG.read_text())
    (healthz_port,) = free_ports(1)
    config["clientConnection"]["kubeconfig"] = str(plane.kubeconfig)
    config["leaderElection"] = {"leaderElect": False}
    config["profiles"] = [{**profile, "schedulerName": scheduler_name}
                          for profile in config.get("profiles") or [{}]]
    (entry,) = config["extenders"]
    entry["urlPrefix"] = extender_url
    entry["enableHTTPS"] = extender_url.startswith("https://")  # the stand-in extender speaks plain HTTP:
    entry.pop("tlsConfig", None)  # its mutual TLS is tested in test_extender_tls_e2e.py
    if weight is not None:
        entry["weight"] = weight
    path = workdir / f"{scheduler_name}.yaml"
    path.write_text(yaml.safe_dump(config))
    args = scheduler_args(config=path, kubeconfig=plane.kubeconfig, port=healthz_port)
    process = spawn("kube-scheduler", [binaries.kube_scheduler, *args], workdir / f"{scheduler_name}.log")
    wait_until(lambda: is_ok(f"https://127.0.0.1:{healthz_port}/healthz", verify=False),
               what="kube-scheduler with the deploy config", timeout=60, watch=[process])
    return process


def _node_of(core_v1: client.CoreV1Api, namespace: str, name: str) -> str | None:
    node: str | None = core_v1.read_namespaced_pod(name, namespace).spec.node_name
    return node


@pytest.mark.parametrize(("weight", "expected"), [
    pytest.param(None, "busy", id="shipped-weight-keeps-the-extenders-choice"),
    pytest.param(PRE_CONFIG_WEIGHT, "idle", id="weight-5-lets-least-allocated-overrule"),
])
def test_shipped_config_runs_and_keeps_the_extenders_choice(
    testenv_binaries: Binaries, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
    make_node: MakeNode, extender: PreferringExtender, tmp_path: Path, weight: int | None, expected: str,
) -> None:
    busy = make_node(allocatable=SMALL_NODE)
    idle = make_node(allocatable=SMALL_NODE)
    extender.nodes = {busy, idle}
    extender.preferred = busy
    filler = pod_manifest("filler", node_name=busy)
    filler["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "6", "memory": "6Gi"}}
    core_v1.create_namespaced_pod(namespace, filler)

    scheduler_name = f"gpupool-config-{uuid.uuid4().hex[:6]}"
    process = run_scheduler(testenv_binaries, control_plane, tmp_path, extender.url, scheduler_name, weight)
    try:
        core_v1.create_namespaced_pod(namespace, pod_manifest("gpu", limits={GPU_MEM: "4"},
                                                              scheduler_name=scheduler_name))
        chosen = wait_for(lambda: _node_of(core_v1, namespace, "gpu"), timeout=60, what="gpu pod bound")
    finally:
        process.stop()
    assert chosen == (busy if expected == "busy" else idle)
