"""ResourceGroup writes judged by the requester's permissions (seed 002), through the same rule as
``gpupool groups check``, and the webhook paths that serve them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpupool.extender.admission import QuotaAdmission, Verdict
from gpupool.extender.group_subjects import GroupSubjectAdmission
from gpupool.extender.group_writes import GroupWriteAdmission, sar_permissions
from gpupool.extender.http.admission_review import GROUP_WRITES_PATH, POD_GROUPS_PATH, AdmissionApi
from gpupool.extender.http.body import BodyReader
from gpupool.extender.metrics import ExtenderMetrics
from tests.extender.tenancy_world import gpu_pod, group, world
from tests.kube.builders import node
from tests.kube.test_group_permission import FakeAuthorization

GRANTS = {("alice", "update", "n1"), ("admin", "update", "")}


def judge(operation: str, obj: dict[str, Any] | None, old: dict[str, Any] | None = None,
          user: str = "alice") -> tuple[Verdict, FakeAuthorization]:
    api = FakeAuthorization(GRANTS)
    return GroupWriteAdmission(sar_permissions(api)).review(operation, obj, old, user, ("team",)), api


@pytest.mark.parametrize(("operation", "obj", "old", "refused"), [
    pytest.param("CREATE", group("g", {"n1": None}), None, None, id="create-own-node"),
    pytest.param("CREATE", group("g", {"n1": None, "n2": ["GPU-1"]}), None, "n2", id="create-foreign-gpu"),
    pytest.param("UPDATE", group("g", {"n1": None}), group("g", {"n1": None, "n2": None}), "n2",
                 id="update-dropping-a-foreign-node"),
    pytest.param("UPDATE", group("g", {"n2": None}, shared=True), group("g", {"n2": None}), "n2",
                 id="update-shared-of-a-foreign-group"),
    pytest.param("DELETE", None, group("g", {"n2": None}), "n2", id="delete-a-foreign-group"),
    pytest.param("DELETE", None, group("g", {"n1": None}), None, id="delete-own-group"),
])
def test_a_write_is_refused_naming_the_nodes_the_requester_may_not_modify(
        operation: str, obj: dict[str, Any] | None, old: dict[str, Any] | None, refused: str | None) -> None:
    verdict, api = judge(operation, obj, old)
    assert all(r["spec"]["user"] == "alice" and r["spec"]["groups"] == ["team"] for r in api.reviews)
    if refused is None:
        assert verdict == Verdict(True)
    else:
        assert not verdict.allowed
        assert f"ResourceGroup g: alice may not modify node(s) {refused} (update or patch on nodes)" in verdict.reason


def test_an_admin_over_every_node_costs_two_reviews() -> None:
    verdict, api = judge("CREATE", group("g", {f"n{i}": None for i in range(300)}), user="admin")
    assert verdict.allowed and len(api.reviews) <= 2


def test_an_unreadable_group_is_refused_with_the_field_and_asks_nothing() -> None:
    broken = group("g", {"n1": None})
    broken["spec"]["nodes"].append({"name": "n1"})
    verdict, api = judge("CREATE", broken)
    assert not verdict.allowed and "node n1 is listed twice" in verdict.reason and not api.reviews


def test_a_stored_group_the_codec_cannot_read_still_counts_its_nodes() -> None:
    stored = group("g", {"n2": None})
    stored["spec"]["shared"] = "yes"
    verdict, _ = judge("DELETE", None, stored)
    assert not verdict.allowed and "n2" in verdict.reason


def review(kind: str, operation: str, obj: Any, old: Any = None, user: str = "alice",
           namespace: str = "") -> dict[str, Any]:
    resource = "pods" if kind == "Pod" else "resourcegroups"
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": resource}, "namespace": namespace,
        "operation": operation, "object": obj, "oldObject": old,
        "userInfo": {"username": user, "groups": ["system:authenticated"]}}}


def post(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    cache = world([node("n1", [16_384]), node("n2", [16_384])],
                  groups=[group("mine", {"n1": None}, subjects=[{"kind": "User", "name": "alice"}])])
    api = AdmissionApi(QuotaAdmission(cache, cache.names), ExtenderMetrics(), BodyReader(),
                       pod_groups=GroupSubjectAdmission(cache, cache.tenancy.names),
                       group_writes=GroupWriteAdmission(sar_permissions(FakeAuthorization(GRANTS))))

    async def main() -> tuple[int, dict[str, Any]]:
        async with TestClient(TestServer(api.app())) as client:
            resp = await client.post(path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            return resp.status, json.loads(await resp.read())

    return asyncio.run(main())


def test_the_resourcegroup_path_answers_with_the_requesters_verdict() -> None:
    status, body = post(GROUP_WRITES_PATH, review("ResourceGroup", "CREATE", group("g", {"n2": None})))
    assert status == 200 and body["response"]["allowed"] is False
    assert body["response"]["status"]["message"].startswith("ResourceGroup g: alice may not modify node(s) n2")
    status, body = post(GROUP_WRITES_PATH, review("ResourceGroup", "CREATE", group("g", {"n1": None})))
    assert status == 200 and body["response"]["allowed"] is True


def test_the_pod_groups_path_answers_with_the_subjects_verdict() -> None:
    pod = gpu_pod("p", "team-b", group_label="mine", whole=1)
    status, body = post(POD_GROUPS_PATH, review("Pod", "CREATE", pod, user="alice", namespace="team-b"))
    assert status == 200 and body["response"]["allowed"] is True
    status, body = post(POD_GROUPS_PATH, review("Pod", "CREATE", pod, user="bob", namespace="team-b"))
    assert body["response"]["allowed"] is False and "nor the requester bob" in body["response"]["status"]["message"]


def test_user_info_of_the_wrong_shape_is_a_400() -> None:
    body = review("ResourceGroup", "CREATE", group("g", {"n1": None}))
    body["request"]["userInfo"] = {"username": "alice", "groups": "admins"}
    status, answer = post(GROUP_WRITES_PATH, body)
    assert status == 400 and "request.userInfo.groups" in answer["Error"]
