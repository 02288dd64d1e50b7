"""deploy/scheduler-config-*.yaml keep gpupool's placement (docs/fidelity.md, "kube-scheduler's own scores").

kube-scheduler adds the extender's 0..10 x 10 x weight to its score plugins' 0..100 x their weight.
The extender's best node keeps the highest total only if one step of the extender outweighs every
plugin together, and it is only seen at all if kube-scheduler does not stop filtering early.
A configuration without ``prioritizeVerb`` keeps it another way: the extender's filter passes only
its best nodes (``--filter-best-only``), so there is no weight to check, and the file must say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10

DEFAULT_SCORE_WEIGHTS: dict[str, dict[str, int]] = {
    # kube-scheduler 1.25+ (pkg/scheduler/apis/config/v1/default_plugins.go; the same in 1.35-1.37)
    "v1": {"TaintToleration": 3, "NodeAffinity": 2, "NodeResourcesFit": 1, "PodTopologySpread": 2,
           "InterPodAffinity": 2, "NodeResourcesBalancedAllocation": 1, "ImageLocality": 1},
}


def configs() -> list[Any]:
    found = []
    for path in sorted(DEPLOY.glob("scheduler-config-*.yaml")):
        doc = yaml.safe_load(path.read_text())
        found.append(pytest.param(doc, id=path.name))
    return found


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in sorted(DEPLOY.glob("scheduler-config-*.yaml"))])
def test_a_configuration_without_prioritize_names_the_extender_flag_it_needs(path: Path) -> None:
    """Without prioritizeVerb, kube-scheduler's plugins choose among every node filter passes: only
    an extender run with --filter-best-only keeps the policy's choice."""
    (extender,) = yaml.safe_load(path.read_text())["extenders"]
    if "prioritizeVerb" not in extender:
        assert "--filter-best-only" in path.read_text().split("apiVersion:")[0]
        assert "weight" not in extender  # it would weigh nothing: a reader would take it for a setting
    assert extender["filterVerb"] and extender["bindVerb"]


def test_both_modes_are_shipped_for_the_current_api_version() -> None:
    """The filter-and-prioritize and the best-only configuration, as ``kubescheduler.config.k8s.io/v1``
    (every supported release reads it; v1beta1 files are gone with Kubernetes 1.20)."""
    shipped = {(c.values[0]["apiVersion"].split("/")[1], "prioritizeVerb" in c.values[0]["extenders"][0])
               for c in configs()}
    assert shipped == {("v1", p) for p in (True, False)}


def score_weights(config: dict[str, Any]) -> dict[str, int]:
    """The default score plugins' weights with the profile's changes (one profile at most)."""
    weights = dict(DEFAULT_SCORE_WEIGHTS[config["apiVersion"].split("/")[1]])
    for profile in config.get("profiles") or []:
        plugins = profile.get("plugins") or {}
        for point in ("score", "multiPoint"):
            chosen = plugins.get(point) or {}
            for plugin in chosen.get("disabled") or []:
                if plugin["name"] == "*":
                    weights.clear()
                weights.pop(plugin["name"], None)
            for plugin in chosen.get("enabled") or []:
                weights[plugin["name"]] = plugin.get("weight", 1)
    return weights


def configs_with(prioritize: bool) -> list[Any]:
    return [c for c in configs() if ("prioritizeVerb" in c.values[0]["extenders"][0]) == prioritize]


@pytest.mark.parametrize("config", configs_with(prioritize=True))
def test_one_extender_step_outweighs_every_score_plugin(config: dict[str, Any]) -> None:
    (extender,) = config["extenders"]
    one_step = extender["weight"] * MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY
    assert one_step > MAX_NODE_SCORE * sum(score_weights(config).values())


@pytest.mark.parametrize("config", configs())
def test_every_feasible_node_reaches_the_extender(config: dict[str, Any]) -> None:
    assert config.get("percentageOfNodesToScore") == 100
