"""components/kube-prometheus, rendered with the base by the real ``kubectl kustomize``.

The ServiceMonitor and PodMonitor are the Prometheus Operator's custom resources: the test
environment's apiserver has no monitoring.coreos.com CRDs, so their shape is checked here, offline:
only fields of the operator's monitoring.coreos.com/v1 API that gpupool relies on, values of the
right form, and each one pointing at what the base actually runs (selector → the workload's labels,
port name → a port the pod or Service has, path → where the process serves /metrics). The
component's other objects also go through a server-side dry run (tests/e2e/test_monitoring_e2e.py).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.nodeagent.metrics import DEFAULT_METRICS_PORT
from tests.deploy.kustomize_render import DEPLOY, KUSTOMIZE, pod_spec, render, require_kubectl

COMPONENT = KUSTOMIZE / "components" / "kube-prometheus"
DASHBOARD = COMPONENT / "gpupool-dashboard.json"
DASHBOARD_LINK = DEPLOY / "grafana" / "gpupool-dashboard.json"
OPERATOR_GROUP = "monitoring.coreos.com/"
DCGM_EXPORTER_PORT = 9400
#: The operator's Duration pattern (monitoring.coreos.com/v1).
DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")
#: The fields gpupool's monitors may use, per the operator's v1 API (a typo would be dropped or refused).
SPEC_FIELDS = {"ServiceMonitor": {"selector", "endpoints", "namespaceSelector", "jobLabel"},
               "PodMonitor": {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel"}}
ENDPOINT_FIELDS = {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "relabelings",
                   "metricRelabelings"}


@pytest.fixture(autouse=True)
def _kubectl() -> None:
    require_kubectl()


def with_kube_prometheus(tmp_path: Path, component: bool = True) -> list[dict[str, Any]]:
    """The base with components/kube-prometheus (or without, to compare), as an admin's overlay."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(KUSTOMIZE / "base", tmp_path)],
        "components": [os.path.relpath(COMPONENT, tmp_path)] if component else []}))
    return render(str(tmp_path))


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = (d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)
    return doc


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def check_monitor_shape(doc: dict[str, Any]) -> dict[str, Any]:
    """The one endpoint of a ServiceMonitor/PodMonitor, after checking its fields' names and forms."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    spec = doc["spec"]
    assert set(spec) <= SPEC_FIELDS[doc["kind"]], set(spec) - SPEC_FIELDS[doc["kind"]]
    (endpoint,) = spec["endpoints" if doc["kind"] == "ServiceMonitor" else "podMetricsEndpoints"]
    assert set(endpoint) <= ENDPOINT_FIELDS, set(endpoint) - ENDPOINT_FIELDS
    assert isinstance(endpoint["port"], str)  # a port *name*: numbers move, names stay
    assert endpoint["scheme"] in ("http", "https") and endpoint["path"] == "/metrics"
    assert DURATION.match(endpoint["interval"]), endpoint["interval"]
    assert isinstance(endpoint.get("honorLabels", False), bool)
    return dict(endpoint)


@pytest.mark.slow
def test_podmonitor_scrapes_every_agent_pod_on_its_metrics_port_keeping_workload_labels(tmp_path: Path) -> None:
    docs = with_kube_prometheus(tmp_path)
    monitor = one(docs, "PodMonitor", "gpupool-node-agent")
    endpoint = check_monitor_shape(monitor)
    agents = one(docs, "DaemonSet", "gpupool-node-agent")
    assert monitor["metadata"]["namespace"] == agents["metadata"]["namespace"]
    assert matches(monitor["spec"]["selector"], agents["spec"]["template"]["metadata"]["labels"])
    (container,) = pod_spec(agents)["containers"]  # type: ignore[index]
    ports = {p["name"]: p for p in container["ports"]}
    assert ports[endpoint["port"]]["containerPort"] == DEFAULT_METRICS_PORT
    assert f"--metrics-port={DEFAULT_METRICS_PORT}" in container["args"]
    # gpupool_container_* carry the workload's namespace/pod/container: kept, not exported_*.
    assert endpoint["honorLabels"] is True


@pytest.mark.slow
def test_servicemonitor_scrapes_the_extenders_health_port_through_its_metrics_service(tmp_path: Path) -> None:
    docs = with_kube_prometheus(tmp_path)
    monitor = one(docs, "ServiceMonitor", "gpupool-extender")
    endpoint = check_monitor_shape(monitor)
    assert not endpoint.get("honorLabels")  # the extender's series have no namespace/pod labels of their own
    (service,) = [d for d in docs if d["kind"] == "Service" and matches(monitor["spec"]["selector"],
                                                                         d["metadata"].get("labels", {}))]
    assert service["metadata"]["namespace"] == monitor["metadata"]["namespace"]
    assert service["spec"]["clusterIP"] == "None"
    extender = one(docs, "Deployment", "gpupool-extender")
    assert all(extender["spec"]["template"]["metadata"]["labels"].get(k) == v
               for k, v in service["spec"]["selector"].items())
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    (container,) = pod_spec(extender)["containers"]  # type: ignore[index]
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--health-port={container_ports[port['targetPort']]}" in container["args"]


def test_dashboard_configmap_is_the_one_dashboard_file_labelled_for_grafanas_sidecar(tmp_path: Path) -> None:
    docs = with_kube_prometheus(tmp_path)
    config_map = one(docs, "ConfigMap", "gpupool-grafana-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"] == {"gpupool-dashboard.json": DASHBOARD.read_text()}
    assert json.loads(config_map["data"]["gpupool-dashboard.json"])["uid"] == "gpupool"
    assert DASHBOARD_LINK.resolve() == DASHBOARD.resolve()  # deploy/grafana's copy is a link, not a copy


@pytest.mark.slow
def test_the_component_only_adds_objects(tmp_path: Path) -> None:
    """Everything the base renders comes out unchanged; the component brings only its own objects."""
    def key(d: dict[str, Any]) -> tuple[str, str, str]:
        return d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]
    base = {key(d): d for d in with_kube_prometheus(tmp_path / "base", component=False)}
    with_it = {key(d): d for d in with_kube_prometheus(tmp_path / "with")}
    assert {k: with_it[k] for k in base} == base
    assert {k[0] for k in set(with_it) - set(base)} == {
        "Service", "ServiceMonitor", "PodMonitor", "Role", "RoleBinding", "ConfigMap"}


def test_the_agent_stays_off_the_dcgm_exporters_port() -> None:
    docs = render("overlays/production")
    agents = one(docs, "DaemonSet", "gpupool-node-agent")
    (container,) = pod_spec(agents)["containers"]  # type: ignore[index]
    ports = {(p.get("containerPort"), p.get("hostPort")) for p in container["ports"]}
    assert ports == {(DEFAULT_METRICS_PORT, DEFAULT_METRICS_PORT)} and DEFAULT_METRICS_PORT != DCGM_EXPORTER_PORT
    annotations = agents["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(DEFAULT_METRICS_PORT)
