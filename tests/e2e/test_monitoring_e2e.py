"""Monitoring end to end: a real Prometheus scrapes a running extender and node agent, and every query
of the shipped Grafana dashboard returns data.

Prometheus is Debian's ``prometheus`` package (:mod:`gpupool.testenv.prometheus`, installed when
missing and root; otherwise the tests skip with the reason). It scrapes the extender's and the
agent's local ports by a static configuration, the way a PodMonitor/ServiceMonitor's generated
configuration would reach them at their pod addresses. The ServiceMonitor and PodMonitor objects
themselves need the Prometheus Operator's CRDs, which the test environment does not have: their
shape is checked offline (tests/deploy/test_kube_prometheus.py); the component's other objects (the
extender's metrics Service, the discovery Roles, the dashboard ConfigMap) go through a server-side
dry run here.

The dashboard's queries are taken from its JSON (every panel target; each query variable's
``label_values`` through the label API), with ``$node``, ``$namespace`` and ``$pod`` set to their
"All" value, and each must come back non-empty: a renamed series, a wrong label or a family with no
samples shows here as an empty panel would.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.errors import BuildImpossibleError
from gpupool.testenv.prometheus import PrometheusProcess, ensure_prometheus, static_config
from tests.deploy.test_kube_prometheus import DASHBOARD, OPERATOR_GROUP, with_kube_prometheus
from tests.e2e.e2e_support import ExtenderProcess, NodeAgentProcess, StartKubelet, free_port, gpu_pod_manifest, wait_for
from tests.e2e.test_deploy_e2e import lost_fields
from tests.e2e.test_gpu_pod_e2e import AGENT_ARGS, GPUS, running, shared, wait_gpu_node
from tests.e2e.test_kustomize_e2e import by_identity, dry_run, gpupool_namespaces  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<match>.+),\s*)?(?P<label>\w+)\)$")
DATA_TIMEOUT_S = 60
StartPrometheus = Callable[[dict[str, list[str]]], PrometheusProcess]
"""Starts a Prometheus scraping the targets of each job (job name → ``host:port`` list)."""


@pytest.fixture
def prometheus_binary() -> Path:
    try:
        return ensure_prometheus()
    except BuildImpossibleError as exc:
        pytest.skip(f"no Prometheus for the monitoring test: {exc}")


@pytest.fixture
def prometheus(prometheus_binary: Path, tmp_path: Path) -> Iterator[StartPrometheus]:
    started: list[PrometheusProcess] = []

    def start(jobs: dict[str, list[str]]) -> PrometheusProcess:
        workdir = tmp_path / "prometheus"
        workdir.mkdir()
        process = PrometheusProcess(prometheus_binary, workdir, static_config(jobs, interval_s=1.0), free_port())
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.stop()


def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(where, kind, query) with the variables at their "All" value; kind: ``expr`` or ``variable``."""
    values = {v["name"]: v.get("allValue", ".*") for v in dashboard["templating"]["list"] if v["type"] == "query"}

    def substitute(text: str) -> str:
        return VARIABLE.sub(lambda m: values[m.group(1) or m.group(2)], text)

    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", "expr", substitute(target["expr"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield f"variable {variable['name']}", "variable", substitute(variable["query"]["query"])


def empty_queries(prometheus: PrometheusProcess, queries: list[tuple[str, str, str]]) -> list[str]:
    """The queries (by where) that return nothing now."""
    empty = []
    for where, kind, query in queries:
        if kind == "expr":
            got = prometheus.query(query)
        else:
            parsed = LABEL_VALUES.match(query)
            assert parsed, f"{where}: not a label_values() query: {query}"
            params = {"match[]": parsed["match"]} if parsed["match"] else {}
            got = prometheus.api(f"label/{parsed['label']}/values", **params)
        if not got:
            empty.append(f"{where}: {query}")
    return empty


def test_prometheus_scrapes_extender_and_agent_and_every_dashboard_query_returns_data(
    core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet,
    start_node_agent: Callable[..., NodeAgentProcess], gpupool_extender: ExtenderProcess,
    prometheus: StartPrometheus,
) -> None:
    node = f"e2e-mon-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(node)
    agent = start_node_agent(kubelet, GPUS, AGENT_ARGS)  # wait_gpu_node checks the gpushare alias too
    wait_gpu_node(core_v1, kubelet, agent)
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("watched", [("main", shared(16, 30))], node=node))
    wait_for(lambda: running(core_v1, namespace, "watched"), timeout=90, what=f"watched Running\n{agent.log()}")

    extender_target = gpupool_extender.url.removeprefix("http://")
    agent_target = f"127.0.0.1:{agent.metrics_port}"
    server = prometheus({"gpupool-extender": [extender_target], "gpupool-node-agent": [agent_target]})
    wait_for(lambda: (lambda up: up if up and set(up.values()) == {"up"} and len(up) == 2 else None)(
        server.targets_up()), timeout=DATA_TIMEOUT_S, what=f"both targets up\n{server.log_tail()}")

    queries = list(dashboard_queries(json.loads(DASHBOARD.read_text())))
    assert len(queries) >= 20
    deadline = time.monotonic() + DATA_TIMEOUT_S
    empty = empty_queries(server, queries)
    while empty and time.monotonic() < deadline:  # increase() needs two scrapes, the monitor a sample
        time.sleep(1)
        empty = empty_queries(server, queries)
    assert empty == [], "dashboard queries without data:\n" + "\n".join(empty) + f"\n{agent.log()}"

    # The units: bytes and ratios, the values the pod was granted (16 x 256 MiB, 30 %).
    [limit] = server.query(f'gpupool_container_memory_limit_bytes{{namespace="{namespace}", pod="watched"}}')
    assert float(limit["value"][1]) == 16 * 256 * 2**20
    [share] = server.query(f'gpupool_container_compute_share_ratio{{namespace="{namespace}", pod="watched"}}')
    assert float(share["value"][1]) == pytest.approx(0.3)
    [booked] = server.query("gpupool_cluster_gpu_compute_allocated_cards")
    assert float(booked["value"][1]) == pytest.approx(0.3)


def test_the_component_s_standard_objects_pass_server_side_dry_run(
    control_plane: ControlPlane, gpupool_namespaces: None, tmp_path: Path,  # noqa: F811 (fixture)
) -> None:
    """What the kube-prometheus component adds besides the operator's kinds (those need its CRDs,
    absent here, and are checked offline) is accepted by the real apiserver as written."""
    docs = with_kube_prometheus(tmp_path)
    base = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
            for d in with_kube_prometheus(tmp_path / "base-only", component=False)}
    added = [d for d in docs if (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) not in base]
    sent = [d for d in added if not d["apiVersion"].startswith(OPERATOR_GROUP)]
    assert {d["kind"] for d in sent} == {"Service", "Role", "RoleBinding", "ConfigMap"}
    result = dry_run(control_plane, sent)
    assert result.returncode == 0, result.stderr
    answers = by_identity(result.stdout)
    for doc in sent:
        answer = answers[(doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])]
        assert lost_fields(doc, answer) == [], (doc["kind"], doc["metadata"]["name"])
