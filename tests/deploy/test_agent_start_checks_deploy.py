"""The installed node agent stops at once on a failed start-up check and says why where admins look.

Both packages (the chart and every kustomize overlay) run the agent with ``--exit-on-failed-check``,
so a node whose agent cannot serve (no GPUs listed, kubelet's directories not mounted, an
interception library the loader cannot load) shows a failing pod rather than a running agent that
serves nothing; ``FallbackToLogsOnError`` makes the end of its log, the failed checks, the
container's termination message, shown by ``kubectl describe pod`` (docs/node-agent.md).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.helm_render import find, render
from tests.deploy.kustomize_render import OVERLAYS, pod_spec
from tests.deploy.kustomize_render import render as kustomize

# Slow, as the chart's other tests: helm and kubectl kustomize run as processes.
pytestmark = pytest.mark.slow


def _agent(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec = pod_spec(find(docs, "DaemonSet", "gpupool-node-agent"))
    assert spec is not None
    container: dict[str, Any] = spec["containers"][0]
    assert container["name"] == "node-agent"
    return container


def _stops_on_a_failed_check_and_reports_it(container: dict[str, Any]) -> None:
    assert "--exit-on-failed-check" in container["args"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


@pytest.mark.parametrize("values", [{}, {"nodeAgent.isolation": "none", "nodeAgent.dra": True}],
                         ids=["defaults", "other-values"])
def test_the_charts_agent_stops_on_a_failed_start_up_check(values: dict[str, Any]) -> None:
    _stops_on_a_failed_check_and_reports_it(_agent(render(values)))


@pytest.mark.parametrize("overlay", ["base", *OVERLAYS])
def test_the_kustomize_agent_stops_on_a_failed_start_up_check(overlay: str) -> None:
    _stops_on_a_failed_check_and_reports_it(_agent(kustomize("base" if overlay == "base" else f"overlays/{overlay}")))
