"""``POST /admission/pods``: AdmissionReview v1 and v1beta1 in and out, denial with the reason,
other operations admitted, and a 400 with the reason for a body that is no AdmissionReview."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpupool.extender.admission import QuotaAdmission
from gpupool.extender.http.admission_review import ADMISSION_PATH, AdmissionApi
from gpupool.extender.http.body import BodyReader
from gpupool.extender.metrics import ExtenderMetrics
from tests.extender.tenancy_world import gpu_pod, quota, world
from tests.kube.builders import node

DENIED = "GpuQuota team-a/gpus: whole GPUs limit 1, used 0, asked 2"


def review(pod: Any, *, version: str = "admission.k8s.io/v1", operation: str = "CREATE", uid: str = "u-1",
           namespace: str = "team-a") -> dict[str, Any]:
    return {"apiVersion": version, "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "operation": operation, "object": pod}}


def post(*bodies: bytes) -> list[tuple[int, dict[str, Any]]]:
    """POST each body to a webhook over a cluster with one quota (team-a: 1 whole GPU)."""
    cache = world([node("n1", [16_384] * 4)], quotas=[quota("team-a", hard={"wholeGpus": 1})])
    api = AdmissionApi(QuotaAdmission(cache, cache.names), ExtenderMetrics(), BodyReader())

    async def main() -> list[tuple[int, dict[str, Any]]]:
        async with TestClient(TestServer(api.app())) as client:
            found = []
            for body in bodies:
                resp = await client.post(ADMISSION_PATH, data=body, headers={"Content-Type": "application/json"})
                found.append((resp.status, json.loads(await resp.read())))
            return found

    return asyncio.run(main())


def one(body: Any) -> tuple[int, dict[str, Any]]:
    return post(json.dumps(body).encode())[0]


@pytest.mark.parametrize("version", [
    pytest.param("admission.k8s.io/v1", id="v1"), pytest.param("admission.k8s.io/v1beta1", id="v1beta1")])
def test_over_the_limit_is_denied_with_the_reason_in_the_requests_version(version: str) -> None:
    status, body = one(review(gpu_pod("p", "team-a", whole=2), version=version, uid="abc"))
    assert status == 200
    assert body == {"apiVersion": version, "kind": "AdmissionReview", "response": {
        "uid": "abc", "allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": DENIED}}}


@pytest.mark.parametrize("version", [
    pytest.param("admission.k8s.io/v1", id="v1"), pytest.param("admission.k8s.io/v1beta1", id="v1beta1")])
def test_within_the_limit_is_allowed(version: str) -> None:
    status, body = one(review(gpu_pod("p", "team-a", whole=1), version=version))
    assert (status, body) == (200, {"apiVersion": version, "kind": "AdmissionReview",
                                    "response": {"uid": "u-1", "allowed": True}})


def test_only_a_pods_creation_is_judged() -> None:
    status, body = one(review(gpu_pod("p", "team-a", whole=2), operation="UPDATE"))
    assert (status, body["response"]["allowed"]) == (200, True)
    delete = review(None, operation="DELETE")
    assert one(delete)[1]["response"] == {"uid": "u-1", "allowed": True}


def test_a_pod_without_name_or_namespace_takes_the_requests() -> None:
    raw = gpu_pod("p", "team-a", whole=2)
    raw["metadata"] = {"generateName": "p-"}
    status, body = one(review(raw))
    assert (status, body["response"]["status"]["message"]) == (200, DENIED)


def test_an_unreadable_gpu_request_is_denied_with_the_reason() -> None:
    """No node could ever take it, quota or not: refused at creation instead of Pending for good."""
    _, body = one(review(gpu_pod("p", "team-a", gpu_core=150)))
    assert body["response"]["allowed"] is False
    assert "GPU compute is a percentage of one card (1..100), got 150" in body["response"]["status"]["message"]


def test_a_request_no_node_of_the_cluster_can_hold_is_denied() -> None:
    """The cluster's largest card has 16 GiB; 64 GiB on one card never fits (the quota is no matter)."""
    _, body = one(review(gpu_pod("p", "team-a", gpu_mem=256)))
    assert body["response"]["allowed"] is False
    assert ("container main asks for 65536 MiB on one card; the largest card has 16384 MiB"
            in body["response"]["status"]["message"])


def test_a_size_reaching_the_validating_webhook_is_judged_as_the_count_it_is() -> None:
    """Without the pod-scheduler webhook nothing rewrites ``4Gi``: stored, it asks kubelet for 4 Gi
    devices, so it is refused naming the unit and what to write."""
    _, body = one(review(gpu_pod("p", "team-a", gpu_mem="4Gi")))
    assert body["response"]["allowed"] is False
    assert "gpupool.io/gpu-mem counts 256 MiB units: 4294967296 is 1 EiB; for 4 GiB write 16" in \
        body["response"]["status"]["message"]


@pytest.mark.parametrize(("body", "reason"), [
    pytest.param(b"{not json", "malformed JSON", id="not-json"),
    pytest.param(b"[]", "expected an AdmissionReview object, got list", id="not-an-object"),
    pytest.param(json.dumps(review({}, version="admission.k8s.io/v2")).encode(),
                 "AdmissionReview.apiVersion: 'admission.k8s.io/v2' is not one of", id="unknown-version"),
    pytest.param(json.dumps(review({}) | {"kind": "Pod"}).encode(), "kind: expected AdmissionReview", id="kind"),
    pytest.param(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
                 "AdmissionReview.request: expected dict, got NoneType", id="no-request"),
    pytest.param(json.dumps(review({}, uid="")).encode(), "request.uid: empty", id="empty-uid"),
    pytest.param(json.dumps(review("a pod")).encode(), "request.object: expected dict, got str", id="object"),
    pytest.param(json.dumps(review({"metadata": 7})).encode(), "request.object.metadata: expected dict",
                 id="metadata"),
    pytest.param(json.dumps(review({"metadata": {}, "spec": {"containers": 1}})).encode(), "", id="bad-pod-spec"),
])
def test_a_body_that_is_no_admission_review_gets_a_400_with_the_reason(body: bytes, reason: str) -> None:
    (status, answer), (after, _) = post(body, json.dumps(review(gpu_pod("p", "team-a", whole=1))).encode())
    if reason:
        assert status == 400
        assert answer["Error"].startswith("bad admission request: ")
        assert reason in answer["Error"]
    else:  # a pod the apiserver would not have accepted: admitted with a warning, never a crash
        assert status == 200 and answer["response"]["allowed"] is True and answer["response"]["warnings"]
    assert after == 200  # and the server keeps answering
