"""The Grafana dashboard asks only for series the exporters expose, in the units they carry.

Its one file is deploy/kustomize/components/kube-prometheus/gpupool-dashboard.json (the component's
ConfigMap is generated from it; deploy/grafana/gpupool-dashboard.json links to it).

The names come from the exporters' own registries, built in process (the extender's with its ledger
collector, the node agent's with the usage monitor running), not from a list kept by hand: a
renamed or dropped series fails here before a dashboard panel goes blank.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpupool.extender.cache import ClusterCache
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.nodeagent.metrics import agent_registry
from tests.nodeagent.usage_world import agent_with_monitor

DASHBOARD = (Path(__file__).resolve().parents[2] / "deploy" / "kustomize" / "components" / "kube-prometheus"
             / "gpupool-dashboard.json")
#: Grafana's unit for each kind of series: bytes (IEC: 40 GiB shows as "40 GiB") and 0-1 ratios.
UNITS = {"_bytes": "bytes", "_ratio": "percentunit"}
SERIES = re.compile(r"\b(gpupool_[a-z0-9_]+)")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("_sum", "_count", "_created"), "gauge": ("",), "info": ("_info",)}


def exposed(registry: CollectorRegistry) -> set[str]:
    """Every sample name a scrape of ``registry`` can carry (also for families without samples yet)."""
    names = set()
    for family in registry.collect():
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


def all_exposed(tmp_path: Path) -> set[str]:
    extender = ExtenderMetrics()
    extender.watch_ledger(ClusterCache())
    agent, monitor, _ = agent_with_monitor(tmp_path)
    try:
        return exposed(extender.registry) | exposed(agent_registry(agent))
    finally:
        monitor.stop()


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield f"variable {variable['name']}", variable["query"]["query"]


def test_every_query_names_only_series_the_exporters_expose(tmp_path: Path) -> None:
    names = all_exposed(tmp_path)
    dashboard = json.loads(DASHBOARD.read_text())
    checked = 0
    for where, expr in queries(dashboard):
        used = SERIES.findall(expr)
        assert used, f"{where}: names no gpupool series: {expr}"
        unknown = sorted(set(used) - names)
        assert not unknown, f"{where}: {unknown} is exposed by no exporter"
        checked += 1
    assert checked >= 20


@pytest.mark.parametrize("view", [
    pytest.param("gpupool_cluster_", id="cluster"), pytest.param("by (node)", id="node"),
    pytest.param("gpupool_card_", id="card"), pytest.param("gpupool_container_", id="pod"),
])
def test_the_dashboard_has_cluster_node_card_and_pod_views(view: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert any(view in expr for _, expr in queries(dashboard))


def test_the_check_catches_a_misspelt_series(tmp_path: Path) -> None:
    """The check itself: a name no exporter has is not in the collected set."""
    names = all_exposed(tmp_path)
    assert "gpupool_card_utilization_ratio" in names and "gpupool_card_state_changes_total" in names
    assert "gpupool_card_utilisation_ratio" not in names


def test_panels_show_bytes_and_ratios_in_their_grafana_units() -> None:
    """A panel plotting ``*_bytes`` series uses Grafana's IEC bytes, one plotting ``*_ratio`` series
    (or a quotient of two totals) a 0-1 percentage; none still uses the old MiB/percent units."""
    dashboard = json.loads(DASHBOARD.read_text())
    checked = 0
    for panel in dashboard["panels"]:
        exprs = [t["expr"] for t in panel.get("targets", [])]
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert unit not in ("decmbytes", "mbytes", "percent"), panel["title"]
        names = {n for e in exprs for n in SERIES.findall(e)}
        if any("/" in e for e in exprs):
            assert unit == "percentunit", panel["title"]
            checked += 1
            continue
        for suffix, wanted in UNITS.items():
            if names and all(n.endswith(suffix) for n in names):
                assert unit == wanted, (panel["title"], unit)
                checked += 1
    assert checked >= 8


def test_no_exported_series_is_in_mib_permille_or_percent(tmp_path: Path) -> None:
    """Prometheus's conventions: base units (bytes) and ratios, never MiB, per-mille or percent."""
    old = sorted(n for n in all_exposed(tmp_path) if re.search(r"_(mib|permille|percent)(_|$)", n))
    assert old == []
