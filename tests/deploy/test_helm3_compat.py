"""charts/gpupool under Helm 3: many clusters are still managed with it (docs/helm.md).

The chart's own tests (tests/deploy/test_helm_chart.py, the parity with kustomize, the install e2e)
run the pinned Helm 4. Here the pinned Helm 3 (the newest 3.x the module proxy serves, built by
``gpupool testenv build`` like Helm 4) lints the chart with every optional part on, renders exactly
the objects Helm 4 renders for the same values, CRDs included, and refuses the same bad values with
the same reasons: whatever holds for the chart under Helm 4 then holds under Helm 3.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from typing import Any

import pytest

from gpupool.testenv.helm import HELM_3, cached_helm
from gpupool.testenv.versions import HELM3
from tests.deploy.helm_render import CHART, RELEASE, RENDER_TIMEOUT_S, render, set_args
from tests.deploy.test_helm_chart import OPTIONAL_PARTS
from tests.deploy.yaml_documents import documents

# Slow, as the chart's other tests: each case runs helm as a process.
pytestmark = pytest.mark.slow

_BUILT = cached_helm(HELM_3)
NO_HELM3 = ("the test environment's Helm 3 is not built (run `gpupool testenv build`): the chart is checked with "
            "the real Helm 3 too")
NAMESPACE = "gpupool-system"


def helm3(*args: str) -> subprocess.CompletedProcess[str]:
    """Helm 3 with ``args`` (skips the test when it is not built); the caller checks the result."""
    if _BUILT is None:
        pytest.skip(NO_HELM3)
    return subprocess.run([str(_BUILT), *args], capture_output=True, text=True, timeout=RENDER_TIMEOUT_S,
                          check=False)


def render3(values: Mapping[str, Any], *, crds: bool = False) -> list[dict[str, Any]]:
    """The objects ``helm template`` of Helm 3 renders, as :func:`tests.deploy.helm_render.render`
    does with Helm 4."""
    result = helm3("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                   *(["--include-crds"] if crds else []), *set_args(values))
    assert result.returncode == 0, f"Helm 3's template failed:\n{result.stderr}"
    return documents(result.stdout)


def by_identity(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The objects by kind, namespace and name: the two Helms order kinds they do not know (the
    cert-manager ones) differently, which changes nothing they install."""
    keyed = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}
    assert len(keyed) == len(docs), "two objects with one identity"
    return keyed


def test_the_binary_is_helm_3_at_its_pin() -> None:
    result = helm3("version", "--short")
    assert result.returncode == 0 and result.stdout.startswith(f"{HELM3}"), result.stdout + result.stderr


@pytest.mark.parametrize("part", ["defaults", *sorted(OPTIONAL_PARTS)])
def test_helm_3_lints_the_chart_and_renders_what_helm_4_renders(part: str) -> None:
    values = OPTIONAL_PARTS.get(part, {})
    result = helm3("lint", "--strict", str(CHART), *set_args(values))
    assert result.returncode == 0, result.stdout + result.stderr
    assert by_identity(render3(values)) == by_identity(render(values))


def test_helm_3_installs_the_same_crds() -> None:
    crds = [d for d in render3({}, crds=True) if d["kind"] == "CustomResourceDefinition"]
    assert crds and crds == [d for d in render({}, crds=True) if d["kind"] == "CustomResourceDefinition"]


@pytest.mark.parametrize(("values", "message"), [
    pytest.param({"nodeAgent.isolation": "off"}, "'/nodeAgent/isolation': value must be one of", id="choice"),
    pytest.param({"extender.replicas": "two"}, "'/extender/replicas': got string, want integer", id="type"),
    pytest.param({"nodeAgent.isolaton": "none"}, "additional properties 'isolaton' not allowed", id="misspelt-key"),
    pytest.param({"nodeAgent.remoteGpu.enabled": True, "nodeAgent.remoteGpu.tlsSecret": ""},
                 "nodeAgent.remoteGpu needs tlsSecret", id="template-fail"),
])
def test_helm_3_refuses_bad_values_with_the_reason(values: dict[str, Any], message: str) -> None:
    """values.schema.json and the templates' ``fail`` hold under Helm 3 too (a misspelt value name
    would otherwise be ignored silently)."""
    result = helm3("template", RELEASE, str(CHART), *set_args(values))
    assert result.returncode != 0, f"Helm 3 accepted {json.dumps(values)}"
    assert message in result.stderr
