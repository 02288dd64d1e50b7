"""Resource groups for DRA claims (issue 24): the cards a new claim may be given, the CEL selectors
that say so, the JSON patch adding them to gpupool's requests, and ``POST /admission/claim-groups``."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpupool.extender.admission import QuotaAdmission
from gpupool.extender.claim_group_admission import NOT_SYNCED, ClaimGroupAdmission
from gpupool.extender.http.admission_review import CLAIM_GROUPS_PATH, AdmissionApi
from gpupool.extender.http.body import BodyReader
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.kube.claim_groups import (
    MAX_SELECTORS,
    ClaimCards,
    ClaimGroupError,
    claim_patch,
    selector_expressions,
)
from gpupool.kube.device_selector import MAX_EXPRESSION_CHARS
from tests.extender.tenancy_world import group, namespace, world
from tests.kube.builders import node

DRIVER = "gpu.gpupool.io"
UUID = 'device.attributes["gpu.gpupool.io"].uuid'


def claim(*requests: dict[str, Any], ns: str = "team-a", labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "c", "namespace": ns}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": list(requests)}}}


def exactly(name: str = "gpu", cls: str = DRIVER, selectors: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls}
    if selectors is not None:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": body}


def cluster(groups: list[dict[str, Any]], namespaces: tuple[dict[str, Any], ...] | list[dict[str, Any]] = ()) -> Any:
    return world([node("n1", [16_384] * 2), node("n2", [16_384] * 2)], groups=groups, namespaces=namespaces)


def judge(cache: Any, obj: dict[str, Any], ns: str = "team-a") -> Any:
    return ClaimGroupAdmission(cache, cache.claims).review(obj, ns)


def patched(obj: dict[str, Any], verdict: Any) -> dict[str, Any]:
    """``obj`` with the verdict's patch applied (its operations are all ``add``)."""
    assert verdict.allowed, verdict.reason
    out = copy.deepcopy(obj)
    for op in verdict.patch:
        assert op["op"] == "add"
        *parents, last = op["path"].split("/")[1:]
        target: Any = out
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if last == "-":
            target.append(op["value"])
        else:
            assert last not in target
            target[last] = op["value"]
    return out


def expressions_of(obj: dict[str, Any], i: int = 0) -> list[str]:
    return [s["cel"]["expression"] for s in obj["spec"]["devices"]["requests"][i]["exactly"].get("selectors", [])]


# ----------------------------------------------------------------------------- which cards

def test_a_namespace_bound_to_a_group_gets_only_its_cards() -> None:
    cache = cluster([group("a", {"n1": None, "n2": ["GPU-n2-1"]}, subjects=[{"kind": "Namespace", "name": "team-a"}])],
                    [namespace("team-a", "a")])
    out = patched(claim(exactly()), judge(cache, claim(exactly())))
    assert expressions_of(out) == [f'{UUID} in ["GPU-n1-0", "GPU-n1-1", "GPU-n2-1"]']


def test_the_claims_own_label_names_the_group() -> None:
    cache = cluster([group("a", {"n1": None}), group("b", {"n2": None})], [namespace("team-a", "a")])
    obj = claim(exactly(), labels={"gpupool.io/group": "b"})
    assert expressions_of(patched(obj, judge(cache, obj))) == [f'{UUID} in ["GPU-n2-0", "GPU-n2-1"]']


def test_several_default_groups_allow_the_union() -> None:
    cache = cluster([group("a", {"n1": ["GPU-n1-0"]}), group("b", {"n2": ["GPU-n2-0"]})],
                    [namespace("team-a", "a,b")])
    assert expressions_of(patched(claim(exactly()), judge(cache, claim(exactly())))) == [
        f'{UUID} in ["GPU-n1-0", "GPU-n2-0"]']


def test_a_claim_without_a_group_avoids_what_unshared_groups_reserve() -> None:
    cache = cluster([group("a", {"n1": None}), group("s", {"n2": ["GPU-n2-0"]}, shared=True)])
    assert expressions_of(patched(claim(exactly()), judge(cache, claim(exactly())))) == [
        f'!({UUID} in ["GPU-n1-0", "GPU-n1-1"])']


def test_no_group_at_all_leaves_the_claim_untouched() -> None:
    verdict = judge(cluster([]), claim(exactly()))
    assert verdict.allowed and verdict.patch == ()


@pytest.mark.parametrize(("groups", "namespaces", "labels", "reason"), [
    pytest.param([group("a", {"n1": None}, subjects=[{"kind": "Namespace", "name": "other"}])],
                 [namespace("team-a", "a")], None, "no resource group of a admits claims of namespace team-a",
                 id="subjects-exclude-namespace"),
    pytest.param([group("a", {"n1": None}, subjects=[{"kind": "ServiceAccount", "namespace": "team-a",
                                                       "name": "default"}])],
                 [namespace("team-a", "a")], None, "no resource group of a admits", id="service-account-subject"),
    pytest.param([], [namespace("team-a", "missing")], None, "resource group missing does not exist", id="missing"),
    pytest.param([], [], {"gpupool.io/group": "nope"}, "resource group nope does not exist", id="label-missing"),
    pytest.param([{"apiVersion": "gpupool.io/v1alpha1", "kind": "ResourceGroup", "metadata": {"name": "a"},
                   "spec": {"nodes": "n1"}}], [namespace("team-a", "a")], None, "resource group a cannot be read",
                 id="broken-group"),
])
def test_what_cannot_be_kept_to_its_groups_is_refused(groups: list[dict[str, Any]], namespaces: list[dict[str, Any]],
                                                      labels: dict[str, str] | None, reason: str) -> None:
    verdict = judge(cluster(groups, namespaces), claim(exactly(), labels=labels))
    assert not verdict.allowed
    assert reason in verdict.reason


def test_an_extender_not_synced_yet_refuses_rather_than_lets_through() -> None:
    cache = cluster([group("a", {"n1": None})], [namespace("team-a", "a")])
    cache.nodes_synced = False
    verdict = judge(cache, claim(exactly()))
    assert (verdict.allowed, verdict.reason) == (False, NOT_SYNCED)


# ----------------------------------------------------------------------------- the patch

def test_only_gpupool_requests_get_the_selector_appended_to_their_own() -> None:
    cache = cluster([group("a", {"n1": ["GPU-n1-0"]})], [namespace("team-a", "a")])
    obj = claim(exactly("other", cls="nic.example.com"), exactly("gpu", selectors=['device.attributes["gpu.gpupool.io"]'
                                                                                   '.model == "Tesla-V100"']),
                {"name": "alt", "firstAvailable": [{"name": "x", "deviceClassName": "nic.example.com"},
                                                   {"name": "y", "deviceClassName": DRIVER}]})
    out = patched(obj, judge(cache, obj))
    allow = f'{UUID} in ["GPU-n1-0"]'
    assert expressions_of(out, 0) == []
    assert expressions_of(out, 1) == ['device.attributes["gpu.gpupool.io"].model == "Tesla-V100"', allow]
    alternatives = out["spec"]["devices"]["requests"][2]["firstAvailable"]
    assert "selectors" not in alternatives[0]
    assert alternatives[1]["selectors"] == [{"cel": {"expression": allow}}]


def test_an_avoid_list_is_split_within_the_expression_limit_and_allow_lists_too_large_are_refused() -> None:
    many = frozenset(f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}" for i in range(600))
    split = selector_expressions(ClaimCards(None, many, "x"), DRIVER)
    assert len(split) > 1 and all(len(e) <= MAX_EXPRESSION_CHARS for e in split)
    assert sorted(u for e in split for u in json.loads(e[e.index(" in [") + 4:-1])) == sorted(many)
    with pytest.raises(ClaimGroupError, match="do not fit one CEL selector"):
        selector_expressions(ClaimCards(many, frozenset(), "resource group big"), DRIVER)


def test_more_selectors_than_kubernetes_allows_is_refused() -> None:
    obj = claim(exactly(selectors=["true"] * MAX_SELECTORS))
    with pytest.raises(ClaimGroupError, match="exceed Kubernetes' 32"):
        claim_patch(obj, frozenset({DRIVER}), ("false",))


# ----------------------------------------------------------------------------- the webhook

def review(obj: Any, *, kind: str = "ResourceClaim", operation: str = "CREATE") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
        "namespace": "team-a", "operation": operation, "object": obj}}


def post(cache: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    api = AdmissionApi(QuotaAdmission(cache, cache.names), ExtenderMetrics(), BodyReader(),
                       claim_groups=ClaimGroupAdmission(cache, cache.claims))

    async def main() -> tuple[int, dict[str, Any]]:
        async with TestClient(TestServer(api.app())) as client:
            resp = await client.post(CLAIM_GROUPS_PATH, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
            return resp.status, json.loads(await resp.read())

    return asyncio.run(main())


def test_the_webhook_answers_with_the_json_patch() -> None:
    cache = cluster([group("a", {"n2": None})], [namespace("team-a", "a")])
    status, body = post(cache, review(claim(exactly())))
    assert status == 200
    response = body["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == ("u-1", True, "JSONPatch")
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/spec/devices/requests/0/exactly/selectors",
         "value": [{"cel": {"expression": f'{UUID} in ["GPU-n2-0", "GPU-n2-1"]'}}]}]


def test_the_webhook_refuses_with_the_reason_and_leaves_other_requests_alone() -> None:
    cache = cluster([], [namespace("team-a", "gone")])
    _, body = post(cache, review(claim(exactly())))
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["message"] == "gpupool: resource group gone does not exist"
    _, body = post(cache, review(claim(exactly()), operation="UPDATE"))
    assert body["response"] == {"uid": "u-1", "allowed": True}
    _, body = post(cache, review({"metadata": {"name": "p"}}, kind="Pod"))
    assert body["response"] == {"uid": "u-1", "allowed": True}
