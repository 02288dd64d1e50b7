"""``POST /admission/pod-scheduler``: the mutating answer (a base64 JSON patch setting
``spec.schedulerName``) in v1 and v1beta1, no patch for pods left alone or for other operations,
and a 400 with the reason for a body that is no AdmissionReview (the apiserver then applies the
webhook's failurePolicy); the server keeps answering."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpupool.extender.admission import QuotaAdmission
from gpupool.extender.http.admission_review import POD_SCHEDULER_PATH, AdmissionApi
from gpupool.extender.http.body import BodyReader
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.scheduler_steering import GPUPOOL_SCHEDULER, ClaimReading, ClaimSource, SchedulerSteering
from tests.extender.tenancy_world import gpu_pod, world
from tests.extender.test_admission_http import review
from tests.kube.builders import node


def post(*bodies: bytes, steering: bool = True, claims: ClaimSource | None = None) -> list[tuple[int, dict[str, Any]]]:
    cache = world([node("n1", [16_384] * 4)])
    api = AdmissionApi(QuotaAdmission(cache, cache.names), ExtenderMetrics(), BodyReader(),
                       steering=SchedulerSteering(cache.names, claims=claims) if steering else None)

    async def main() -> list[tuple[int, dict[str, Any]]]:
        async with TestClient(TestServer(api.app())) as client:
            found = []
            for body in bodies:
                resp = await client.post(POD_SCHEDULER_PATH, data=body, headers={"Content-Type": "application/json"})
                raw = await resp.read()
                found.append((resp.status, json.loads(raw) if resp.content_type == "application/json" else {}))
            return found

    return asyncio.run(main())


def one(body: Any) -> tuple[int, dict[str, Any]]:
    return post(json.dumps(body).encode())[0]


def cpu_pod() -> dict[str, Any]:
    return {"metadata": {"name": "cpu", "namespace": "team-a"},
            "spec": {"schedulerName": "default-scheduler", "containers": [{"name": "c", "image": "busybox"}]}}


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
def test_a_gpu_pod_gets_the_patch_in_the_requests_version(version: str) -> None:
    status, body = one(review(gpu_pod("p", "team-a", whole=1), version=version, uid="abc"))
    assert status == 200 and body["apiVersion"] == version and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == ("abc", True, "JSONPatch")
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/spec/schedulerName", "value": GPUPOOL_SCHEDULER}]


def test_a_cpu_pod_is_allowed_without_a_patch() -> None:
    assert one(review(cpu_pod())) == (200, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                            "response": {"uid": "u-1", "allowed": True}})


class TeamAClaims:
    """team-a's claim "gpu" asks for gpupool's class; team-a's claim "nic" and every other claim do not."""

    def cached(self, namespace: str, kind: str, name: str) -> ClaimReading:
        return ClaimReading("gpu" if (namespace, name) == ("team-a", "gpu") else None)

    def fetch(self, namespace: str, kind: str, name: str, timeout_s: float) -> ClaimReading:
        raise AssertionError("every claim is cached here")


def test_a_claim_pod_is_read_in_the_requests_namespace_and_steered_only_for_gpupools_class() -> None:
    """docs/dra.md "Steering claim pods": the pod in the review may carry no namespace yet."""
    def claim_pod(claim: str) -> dict[str, Any]:
        return {"metadata": {"name": "p"}, "spec": {"resourceClaims": [{"name": "c", "resourceClaimName": claim}],
                                                    "containers": [{"name": "c", "image": "busybox"}]}}

    (gpu, nic, elsewhere) = post(json.dumps(review(claim_pod("gpu"))).encode(),
                                 json.dumps(review(claim_pod("nic"))).encode(),
                                 json.dumps(review(claim_pod("gpu"), namespace="team-b")).encode(),
                                 claims=TeamAClaims())
    assert gpu[0] == 200 and json.loads(base64.b64decode(gpu[1]["response"]["patch"])) == [
        {"op": "add", "path": "/spec/schedulerName", "value": GPUPOOL_SCHEDULER}]
    assert nic == elsewhere == (200, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                      "response": {"uid": "u-1", "allowed": True}})


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_a_pods_creation_is_steered(operation: str) -> None:
    """schedulerName cannot change after creation: any other request is allowed untouched."""
    pod = None if operation == "DELETE" else gpu_pod("p", "team-a", whole=1)
    _, body = one(review(pod, operation=operation))
    assert body["response"] == {"uid": "u-1", "allowed": True}


def test_another_kind_is_allowed_untouched() -> None:
    request = review(gpu_pod("p", "team-a", whole=1))
    request["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert one(request)[1]["response"] == {"uid": "u-1", "allowed": True}


def test_the_path_is_served_only_with_a_steering() -> None:
    (status, _), = post(json.dumps(review(gpu_pod("p", "team-a", whole=1))).encode(), steering=False)
    assert status == 404


@pytest.mark.parametrize(("body", "reason"), [
    pytest.param(b"{not json", "malformed JSON", id="not-json"),
    pytest.param(b"null", "expected an AdmissionReview object, got NoneType", id="null"),
    pytest.param(json.dumps(review({}, version="admission.k8s.io/v9")).encode(),
                 "AdmissionReview.apiVersion: 'admission.k8s.io/v9' is not one of", id="unknown-version"),
    pytest.param(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []}).encode(),
                 "AdmissionReview.request: expected dict, got list", id="request-a-list"),
    pytest.param(json.dumps(review({}, uid="")).encode(), "request.uid: empty", id="empty-uid"),
    pytest.param(json.dumps(review(["a", "pod"])).encode(), "request.object: expected dict, got list", id="object"),
    pytest.param(json.dumps(review({"metadata": "x"})).encode(), "request.object.metadata: expected dict",
                 id="metadata"),
])
def test_a_malformed_review_gets_a_400_with_the_reason(body: bytes, reason: str) -> None:
    (status, answer), (after, answer_after) = post(body, json.dumps(review(gpu_pod("p", "team-a", whole=1))).encode())
    assert status == 400 and answer["Error"].startswith("bad admission request: ") and reason in answer["Error"]
    assert after == 200 and answer_after["response"]["patchType"] == "JSONPatch"  # and the server keeps answering


def test_a_malformed_pod_inside_a_valid_review_is_allowed_untouched() -> None:
    """Left for the apiserver's validation, which runs after the mutating webhooks."""
    _, body = one(review({"metadata": {}, "spec": {"containers": [{"resources": "lots"}], "schedulerName": []}}))
    assert body["response"] == {"uid": "u-1", "allowed": True}
