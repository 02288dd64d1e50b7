"""deploy/crds as the apiserver reads them: structural schemas whose rules refuse what the extender
cannot read (tests/e2e/test_tenancy_e2e.py installs them in a real apiserver)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.api.limits import MAX_TEXT_CHARS
from gpupool.api.quota import decode_quota
from gpupool.api.tenancy import TenancyError

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"
MODEL_KEYS_RULE = f"self.all(k, size(k) >= 1 && size(k) <= {MAX_TEXT_CHARS})"


def schema(crd: str) -> dict[str, Any]:
    doc = yaml.safe_load((CRDS / crd).read_text())
    (version,) = doc["spec"]["versions"]
    found: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return found


def keys(node: Any) -> set[str]:
    """Every key of a schema, at any depth."""
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in keys(v)}
    return set()


def test_gpuquota_models_keys_are_checked_by_a_cel_rule() -> None:
    """An empty model key made the extender read the whole quota as broken (the namespace got no
    GPU): the apiserver refuses it. apiextensions/v1 has no ``propertyNames`` (a structural schema
    drops it), so a CEL rule on the map checks the keys, with the decoder's bounds."""
    models = schema("gpuquotas.yaml")["properties"]["spec"]["properties"]["models"]
    rules = [r["rule"] for r in models["x-kubernetes-validations"]]
    assert rules == [MODEL_KEYS_RULE]
    assert all(r.get("message") for r in models["x-kubernetes-validations"])
    assert models["maxProperties"] == 1000  # bounds the rule's cost: the apiserver estimates it per map


@pytest.mark.parametrize("crd", sorted(p.name for p in CRDS.glob("*.yaml") if p.name != "kustomization.yaml"))
def test_no_crd_uses_a_keyword_structural_schemas_lack(crd: str) -> None:
    assert keys(schema(crd)) & {"propertyNames", "patternProperties", "dependencies", "$ref"} == set()


@pytest.mark.parametrize(("key", "readable"), [
    pytest.param("", False, id="empty"), pytest.param("x" * (MAX_TEXT_CHARS + 1), False, id="too-long"),
    pytest.param("A100-SXM4-40GB", True, id="a-model"), pytest.param("x" * MAX_TEXT_CHARS, True, id="longest"),
])
def test_the_rule_and_the_extenders_decoder_agree(key: str, readable: bool) -> None:
    obj = {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"models": {key: {"wholeGpus": 1}}}}
    assert (1 <= len(key) <= MAX_TEXT_CHARS) == readable  # what the rule says, in Python
    if readable:
        assert decode_quota(obj).per_model[0][0] == key
    else:
        with pytest.raises(TenancyError, match=r"GpuQuota ns/q: spec\.models"):
            decode_quota(obj)
