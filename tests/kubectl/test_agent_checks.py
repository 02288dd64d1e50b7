"""The agent's start-up checks on its Node (``gpupool.io/agent-checks``) in ``inspect`` and ``why``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpupool.api.cluster_settings import AGENT_CHECKS_ANNOTATION
from gpupool.kube.translate import foreign_resources, pod_request
from gpupool.kubectl.agent_checks import checks_trouble
from gpupool.kubectl.inspect import inspect_json, inspect_table, node_views
from gpupool.kubectl.snapshot import build_snapshot
from gpupool.kubectl.usage import NoUsage
from gpupool.kubectl.why import explain, why_json, why_text
from gpupool.nodeagent.assembly import start_annotations
from gpupool.nodeagent.options import AgentOptions
from gpupool.nodeagent.selfcheck import Check, Status, checks_annotation
from tests.kubectl.objects import NAMES, NOW, gpu_node, gpu_pod

AT = datetime(2026, 11, 29, 0, 40, tzinfo=UTC)
WARNED = checks_annotation([Check("GPUs", Status.OK, "2 cards"),
                            Check("refusal at open", Status.WARN, "cgroup v1")], AT)
FAILED = checks_annotation([Check("library loadable", Status.FAIL, "libgpupool.so: cannot open")], AT)
ALL_OK = checks_annotation([Check("GPUs", Status.OK, "2 cards"), Check("enforcement", Status.OK, "shim")], AT)


def with_checks(node: dict[str, Any], value: str) -> dict[str, Any]:
    node["metadata"]["annotations"][AGENT_CHECKS_ANNOTATION] = value
    return node


def test_the_plugin_reads_the_annotation_the_agent_writes() -> None:
    checks = [Check("refusal at open", Status.WARN, "cgroup v1")]
    written = start_annotations(AgentOptions("gpu-1", start_checks=checks))
    assert checks_trouble({"metadata": {"annotations": written}}) == written[AGENT_CHECKS_ANNOTATION]


@pytest.mark.parametrize("value, trouble", [
    pytest.param(WARNED, True, id="warn"),
    pytest.param(FAILED, True, id="fail"),
    pytest.param(ALL_OK, False, id="all-ok"),
    pytest.param("", False, id="empty"),
    pytest.param(None, False, id="absent"),
])
def test_only_checks_not_all_ok_are_trouble(value: str | None, trouble: bool) -> None:
    node = gpu_node("a", [16384])
    if value is not None:
        with_checks(node, value)
    assert checks_trouble(node) == (value if trouble else None)


def test_a_detail_that_mentions_warn_does_not_make_an_ok_node_trouble() -> None:
    value = checks_annotation([Check("usage monitor", Status.OK, "no warn fail here")], AT)
    assert checks_trouble(with_checks(gpu_node("a", [16384]), value)) is None


def test_inspect_shows_the_summary_of_a_node_whose_checks_were_not_all_ok() -> None:
    nodes = [with_checks(gpu_node("a", [16384]), WARNED), with_checks(gpu_node("b", [16384]), ALL_OK),
             gpu_node("c", [16384])]
    shown = node_views(build_snapshot(nodes, [], NAMES, now=NOW.timestamp()), NoUsage())
    table = inspect_table(shown)
    assert ("node a: agent start-up checks: 2026-11-29T00:40:00Z at start: 1 ok, 1 warn; "
            "warn refusal at open: cgroup v1") in table
    assert "node b:" not in table and "node c:" not in table
    assert [n["agentChecks"] for n in inspect_json(shown)["nodes"]] == [WARNED, None, None]


def test_why_names_failed_checks_as_a_probable_cause_on_refused_and_fitting_nodes() -> None:
    nodes = [with_checks(gpu_node("broken", [16384], cpu="1"), FAILED), with_checks(gpu_node("fits", [16384]), WARNED),
             with_checks(gpu_node("fine", [16384]), ALL_OK)]
    wanted = gpu_pod("want", 4, cpu="2")
    snapshot = build_snapshot(nodes, [], NAMES, now=NOW.timestamp())
    result = explain(snapshot, pod_request(wanted, NAMES), foreign_resources(wanted))
    assert sorted(name for name, _ in result.fits) == ["fine", "fits"]
    assert [node for group in result.groups for node, _ in group.nodes] == ["broken"]
    text = why_text(result, examples=0)
    assert ("note: node broken: its agent's start-up checks were not all ok, a probable cause of trouble there: "
            f"{FAILED}") in text
    assert ("note: node fits: its agent's start-up checks were not all ok, a probable cause of trouble there: "
            f"{WARNED}") in text
    assert "node fine: its agent" not in text
    assert len(why_json(result)["notes"]) == 2
