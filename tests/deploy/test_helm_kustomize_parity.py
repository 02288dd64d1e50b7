"""One source of truth: charts/gpupool renders the objects deploy/kustomize renders, choice by choice.

Why a comparison and not one package generated from the other: each side is written for its own
readers. The kustomize files carry the reasons (the RBAC headers list the code behind every verb,
and tests/e2e/test_deploy_e2e.py checks them), and an overlay of an admin's own composes them; a
kustomize base generated from ``helm template`` would lose those comments or hold unreadable
generated YAML, and a chart generated from kustomize would need a generator of its own. So both are
written by hand and this module renders both, with the real ``kubectl kustomize`` and the real
``helm template``, and compares the objects: a change to either side that the other does not follow
fails here, naming the object and the field.

Each case pairs chart values with what kustomize renders for the same choice: every overlay, the
base, and the base with each component (the chart's values for "the base" turn off what the
chart's defaults turn on). Differences that are Helm's idiom, not a choice, are normalised away
(:func:`normalise`): Helm's own labels, ``checksum/*`` pod annotations that restart a pod when its
configuration changes, the bootstrap Job's name suffix (a Job's template cannot change, so a new
image gets a new Job), kustomize's generated-name hash, flags given twice (the last one wins, as
the commands read them), the order of volumes, and line breaks inside CEL expressions.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import helm_render
from tests.deploy.helm_render import require_helm
from tests.deploy.kustomize_render import KUSTOMIZE, OVERLAYS, pod_spec, render, require_kubectl

# Slow, so scripts/test-all runs it and a plain pytest does not: each case renders the chart with helm and an overlay
# with kubectl kustomize.
pytestmark = pytest.mark.slow

HELM_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version",
               "helm.sh/chart")
JOB_SUFFIX = re.compile(r"^(gpupool-certs-bootstrap)-[0-9a-f]{8}$")
GENERATED = re.compile(r"^(gpupool-fake-gpus)-[a-z0-9]{10}$")
EXPRESSION_KEYS = ("expression", "messageExpression")

#: Chart values that every case starts from: kustomize renders the image as the overlays set it.
COMMON = {"image.tag": "latest"}
#: What turns the chart's defaults (the production overlay) into the bare base.
BASE = {**COMMON, "certificates.source": "none", "networkPolicy.enabled": False,
        "extender.requireAgentLease": False, "webhooks.scheduler.enabled": False}

#: kustomize component → the chart values that stand for it (on top of BASE).
COMPONENTS: dict[str, dict[str, Any]] = {
    "cert-manager": {"certificates.source": "cert-manager"},
    "certs-bootstrap": {"certificates.source": "bootstrap"},
    "dmem-limits": {"nodeAgent.dmemLimits": True},
    "dra": {"nodeAgent.dra": True},
    "dra-claim-groups": {"webhooks.claimGroups.enabled": True},
    "dra-claim-pods": {"nodeAgent.dra": True, "webhooks.scheduler.enabled": True, "scheduler.claimPods": True},
    "kube-prometheus": {"monitoring.kubePrometheus.enabled": True},
    "network-policy": {"networkPolicy.enabled": True},
    "quota-webhook": {"webhooks.quota.enabled": True},
    "require-agent-lease": {"extender.requireAgentLease": True},
    "remote-gpu": {"nodeAgent.remoteGpu.enabled": True},
    "remote-gpu-node-certificates": {"nodeAgent.remoteGpu.enabled": True, "nodeAgent.remoteGpu.nodeCertificates": True},
    "risk-evict": {"nodeAgent.riskAction": "evict"},
    "scheduler-webhook": {"webhooks.scheduler.enabled": True},
    "shim-isolation": {"nodeAgent.isolation": "shim"},
}
#: component → the components it patches, listed before it (as its kustomization.yaml asks).
NEEDS: dict[str, tuple[str, ...]] = {"dra-claim-pods": ("dra", "scheduler-webhook"),
                                     "remote-gpu-node-certificates": ("remote-gpu",)}
#: Components that patch another's objects when both are there, rendered together (in this order).
TOGETHER: tuple[tuple[str, ...], ...] = (("certs-bootstrap", "remote-gpu", "remote-gpu-node-certificates"),)
#: overlay → the chart values that stand for it, and files given with --set-file.
OVERLAY_VALUES: dict[str, tuple[dict[str, Any], dict[str, Path]]] = {
    "production": (COMMON, {}),
    "production-cert-manager": ({**COMMON, "certificates.source": "cert-manager", "webhooks.quota.enabled": True},
                                {}),
    "dev": ({**COMMON, "extender.replicas": 1, "scheduler.replicas": 1, "nodeAgent.runtimeClassName": "",
             "networkPolicy.enabled": False, "extender.requireAgentLease": False},
            {"nodeAgent.fakeGpus": KUSTOMIZE / "overlays" / "dev" / "gpus.yaml"}),
}


@pytest.fixture(autouse=True)
def _tools() -> None:
    require_kubectl()
    require_helm()


def effective_args(args: list[str]) -> dict[str, Any]:
    """What a command reads from ``args``: its positional words, and each ``--flag[=value]`` with
    the last value given (click keeps the last of a repeated option)."""
    positional = [a for a in args if not a.startswith("-")]
    flags: dict[str, str | None] = {}
    for arg in args:
        if arg.startswith("--"):
            name, has_value, value = arg.partition("=")
            flags[name] = value if has_value else None
    return {"positional": positional, "flags": flags}


def _strings(value: Any, key: str = "") -> Any:
    """``value`` with generated names undone and CEL expressions' whitespace collapsed."""
    if isinstance(value, dict):
        return {k: _strings(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_strings(v, key) for v in value]
    if isinstance(value, str):
        value = GENERATED.sub(r"\1", JOB_SUFFIX.sub(r"\1", value))
        return " ".join(value.split()) if key in EXPRESSION_KEYS else value
    return value


def normalise(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without the differences that are Helm's idiom rather than a choice (module docstring)."""
    doc = _strings(doc)
    labels = doc["metadata"].get("labels") or {}
    for key in HELM_LABELS:
        labels.pop(key, None)
    if doc["kind"] == "ConfigMap" and "config.yaml" in doc.get("data", {}):
        doc["data"]["config.yaml"] = yaml.safe_load(doc["data"]["config.yaml"])
    spec = pod_spec(doc)
    if spec is not None:
        template = doc["spec"]["jobTemplate"]["spec"]["template"] if doc["kind"] == "CronJob" \
            else doc["spec"]["template"]
        annotations = template["metadata"].get("annotations") or {}
        for key in [k for k in annotations if k.startswith("checksum/")]:
            del annotations[key]
        if not annotations:
            template["metadata"].pop("annotations", None)
        for container in template["spec"]["containers"]:
            if "args" in container:
                container["args"] = effective_args(container["args"])
            if "volumeMounts" in container:
                container["volumeMounts"] = sorted(container["volumeMounts"], key=lambda m: m["name"])
        if "volumes" in template["spec"]:
            template["spec"]["volumes"] = sorted(template["spec"]["volumes"], key=lambda v: v["name"])
    return doc


def by_identity(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    normalised = [normalise(d) for d in docs]
    keyed = {(d["apiVersion"], d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
             for d in normalised}
    assert len(keyed) == len(docs), "two objects with one identity"
    return keyed


def differences(chart: Any, kustomize: Any, path: str = "") -> list[str]:
    """Every path where the two differ, with both values."""
    if isinstance(chart, dict) and isinstance(kustomize, dict):
        return [d for k in sorted(set(chart) | set(kustomize), key=str)
                for d in (differences(chart[k], kustomize[k], f"{path}.{k}") if k in chart and k in kustomize
                          else [f"{path}.{k}: only in {'the chart' if k in chart else 'kustomize'}"])]
    if isinstance(chart, list) and isinstance(kustomize, list) and len(chart) == len(kustomize):
        return [d for i, (c, k) in enumerate(zip(chart, kustomize, strict=True))
                for d in differences(c, k, f"{path}[{i}]")]
    return [] if chart == kustomize else [f"{path}: chart {chart!r} != kustomize {kustomize!r}"]


def assert_same(chart_docs: list[dict[str, Any]], kustomize_docs: list[dict[str, Any]]) -> None:
    chart, kustomize = by_identity(chart_docs), by_identity(kustomize_docs)
    assert sorted(chart) == sorted(kustomize), (
        f"only in the chart: {sorted(set(chart) - set(kustomize))}; "
        f"only in kustomize: {sorted(set(kustomize) - set(chart))}")
    found = {identity: diff for identity in chart if (diff := differences(chart[identity], kustomize[identity]))}
    assert not found, "\n".join(f"{identity}:\n  " + "\n  ".join(diff) for identity, diff in found.items())


def with_components(tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    """The base with these components, as an overlay of an admin's own would have it."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(KUSTOMIZE / "base", tmp_path)],
        "components": [os.path.relpath(KUSTOMIZE / "components" / c, tmp_path) for c in components]}))
    return render(str(tmp_path))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_chart_renders_each_overlay(overlay: str) -> None:
    values, files = OVERLAY_VALUES[overlay]
    assert_same(helm_render.render(values, files=files, crds=True), render(f"overlays/{overlay}"))


def test_the_chart_renders_the_base() -> None:
    assert_same(helm_render.render(BASE, crds=True), render("base"))


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_the_chart_renders_each_component(component: str, tmp_path: Path) -> None:
    chart = helm_render.render({**BASE, **COMPONENTS[component]}, crds=True)
    assert_same(chart, with_components(tmp_path, *NEEDS.get(component, ()), component))


@pytest.mark.parametrize("components", TOGETHER, ids="+".join)
def test_the_chart_renders_components_that_patch_each_other(components: tuple[str, ...], tmp_path: Path) -> None:
    """remote-gpu-node-certificates patches certs-bootstrap's Job and Role (the remote GPU CA made by
    the Job): alone, each case above shows nothing of that."""
    values = {k: v for c in components for k, v in COMPONENTS[c].items()}
    assert_same(helm_render.render({**BASE, **values}, crds=True), with_components(tmp_path, *components))


def test_every_component_and_overlay_has_its_chart_values() -> None:
    """A new component or overlay fails here until the chart offers it (and this module pairs them)."""
    shipped = {p.name for p in (KUSTOMIZE / "components").iterdir() if (p / "kustomization.yaml").is_file()}
    assert shipped == set(COMPONENTS)
    overlays = {p.name for p in (KUSTOMIZE / "overlays").iterdir() if (p / "kustomization.yaml").is_file()}
    assert overlays == set(OVERLAY_VALUES) == set(OVERLAYS)


def test_the_comparison_sees_a_difference() -> None:
    """The check itself: one changed field of one object is reported with its path."""
    docs = helm_render.render(COMMON, crds=True)
    kustomize = render("overlays/production")
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "gpupool-extender":
            doc["spec"]["template"]["spec"]["containers"][0]["args"].append("--port=8887")
    with pytest.raises(AssertionError, match=r"flags\.--port: chart '8887' != kustomize '8888'"):
        assert_same(docs, kustomize)
