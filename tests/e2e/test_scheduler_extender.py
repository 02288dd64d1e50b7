"""kube-scheduler calls a configured extender, and only for pods with its managed resources.

The extender here is a ten-line HTTP server in the test; it proves the wiring that gpupool's real
extender will use: ``ExtenderConfig`` with ``managedResources`` (``ignoredByScheduler``) and
``nodeCacheCapable`` (node names instead of whole Node objects).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from gpupool.testenv.config import ExtenderConfig
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import MakeNode, pod_manifest, wait_for

pytestmark = pytest.mark.e2e

GPU_MEM = "gpupool.io/gpu-mem"


class RecordingExtender(ThreadingHTTPServer):
    """Filters every node but ``chosen`` and records the pods it was asked about."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.chosen = ""
        self.asked: list[tuple[str, list[str]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/gpupool"


class _Handler(BaseHTTPRequestHandler):
    server: RecordingExtender

    def do_POST(self) -> None:
        args: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        names = list(args.get("NodeNames") or args.get("nodenames") or [])
        self.server.asked.append((args["Pod"]["metadata"]["name"], names))
        keep = [n for n in names if n == self.server.chosen]
        failed = {n: "not the chosen one" for n in names if n != self.server.chosen}
        body = json.dumps({"NodeNames": keep, "FailedNodes": failed, "Error": ""}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def extender(control_plane: ControlPlane) -> Iterator[RecordingExtender]:
    server = RecordingExtender()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    control_plane.restart_scheduler([ExtenderConfig(
        url_prefix=server.url, filter_verb="filter", prioritize_verb=None, node_cache_capable=True,
        managed_resources=(GPU_MEM,))])
    try:
        yield server
    finally:
        control_plane.restart_scheduler([])  # other tests expect the plain scheduler
        server.shutdown()
        server.server_close()


def test_extender_decides_for_managed_resources_only(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, extender: RecordingExtender
) -> None:
    # Neither node advertises gpu-mem: with ignoredByScheduler the scheduler leaves it to us.
    make_node(labels={"gpupool.io/e2e-extender": "yes"})
    extender.chosen = make_node(labels={"gpupool.io/e2e-extender": "yes"})
    selector = {"gpupool.io/e2e-extender": "yes"}

    core_v1.create_namespaced_pod(namespace, pod_manifest("gpu", limits={GPU_MEM: "4"},
                                                          node_selector=selector))
    core_v1.create_namespaced_pod(namespace, pod_manifest("plain", node_selector=selector))

    gpu = wait_for(lambda: _node_of(core_v1, namespace, "gpu"), timeout=30, what="gpu pod scheduled")
    wait_for(lambda: _node_of(core_v1, namespace, "plain"), timeout=30, what="plain pod scheduled")
    assert gpu == extender.chosen
    asked_about = [pod for pod, _ in extender.asked]
    assert "gpu" in asked_about
    assert "plain" not in asked_about  # pods without a managed resource never reach the extender
    (nodes_offered,) = {tuple(sorted(names)) for pod, names in extender.asked if pod == "gpu"}
    assert extender.chosen in nodes_offered and len(nodes_offered) == 2


def _node_of(core_v1: client.CoreV1Api, namespace: str, name: str) -> str | None:
    node: str | None = core_v1.read_namespaced_pod(name, namespace).spec.node_name
    return node
