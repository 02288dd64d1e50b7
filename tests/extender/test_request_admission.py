"""What a new pod asks for, judged at creation: sizes rewritten to counts (with a warning), pods
gpupool can never place refused with the reason, the rest let through untouched."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.api.names import ResourceNames
from gpupool.extender.admission import QuotaAdmission
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.admission_review import POD_SCHEDULER_PATH, AdmissionApi
from gpupool.extender.http.body import BodyReader
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.request_admission import RequestAdmission
from gpupool.extender.scheduler_steering import GPUPOOL_SCHEDULER, SchedulerSteering
from tests.extender.tenancy_world import gpu_pod, world
from tests.extender.test_admission_http import review
from tests.kube.builders import container, node, pod

NAMES = ResourceNames()
SMALL_CLUSTER = [node("t4-a", [16_384] * 2, model="T4"), node("a100-a", [40_960] * 2, model="A100"),
                 node("t4-b", [16_384] * 4, model="T4")]


def admission(cache: ClusterCache | None = None) -> RequestAdmission:
    return RequestAdmission(cache if cache is not None else world(SMALL_CLUSTER), NAMES)


def limits_pod(annotations: dict[str, str] | None = None, **limits: str | int) -> dict[str, Any]:
    return pod("p", container(**limits), namespace="ml", annotations=annotations)


# ----------------------------------------------------------------------------- sizes to counts
@pytest.mark.parametrize(("written", "count", "warning"), [
    pytest.param("4Gi", "16", "gpupool.io/gpu-mem counts 256 MiB units: 4Gi rewritten as 16 (4 GiB)", id="4Gi"),
    pytest.param("4096Mi", "16", "4096Mi rewritten as 16 (4 GiB)", id="4096Mi"),
    pytest.param("1536Mi", "6", "1536Mi rewritten as 6 (1.5 GiB)", id="1536Mi"),
    pytest.param("1000Mi", "4", "1000Mi rewritten as 4 (1 GiB), rounded up to a whole unit", id="rounded-up"),
    pytest.param("0.5Gi", "2", "0.5Gi rewritten as 2 (512 MiB)", id="fraction-of-a-suffix"),
])
def test_a_size_becomes_the_count_it_means(written: str, count: str, warning: str) -> None:
    raw = limits_pod(gpu_mem=written, gpu_core=30)
    raw["spec"]["containers"][0]["resources"]["requests"] = {"gpupool.io/gpu-mem": written, "gpupool.io/gpu-core": "30"}
    verdict = admission().review(raw)
    assert verdict.allowed
    assert verdict.patch == tuple(
        {"op": "replace", "path": f"/spec/containers/0/resources/{part}/gpupool.io~1gpu-mem", "value": count}
        for part in ("limits", "requests"))
    assert len(verdict.warnings) == 1 and warning in verdict.warnings[0]  # one per value, not per part
    assert verdict.warnings[0].startswith("gpupool: container main: ")


@pytest.mark.parametrize(("resource", "written", "count"), [
    pytest.param("tencent.com/vcuda-memory", "2Gi", "8", id="gpumanager-256-mib"),
    pytest.param("aliyun.com/gpu-mem", "8Gi", "8", id="gpushare-gib"),
])
def test_every_resource_counting_memory_units_is_rewritten(resource: str, written: str, count: str) -> None:
    raw = pod("p", {"name": "c", "resources": {"limits": {resource: written}}})
    serving = node("n", [16_384], serves=("aliyun.com/gpu-mem", "tencent.com/vcuda-memory"))
    verdict = admission(world([serving])).review(raw)
    assert verdict.allowed, verdict.reason
    assert [op["value"] for op in verdict.patch] == [count]


def test_init_containers_are_rewritten_at_their_own_path() -> None:
    raw = pod("p", container(gpu_mem=4), init=[container("setup", gpu_mem="1Gi")])
    verdict = admission().review(raw)
    assert verdict.patch == ({"op": "replace", "path": "/spec/initContainers/0/resources/limits/gpupool.io~1gpu-mem",
                              "value": "4"},)


@pytest.mark.parametrize("written", [
    pytest.param("16", id="a-count"),
    pytest.param("4G", id="decimal-suffix-is-no-size"),  # the apiserver writes a count of 4e9 as 4G
])
def test_counts_are_never_rewritten(written: str) -> None:
    verdict = admission().review(limits_pod(gpu_mem=written))
    assert verdict.patch == ()


def test_a_decimal_size_is_refused_naming_the_unit_and_what_to_write() -> None:
    verdict = admission().review(limits_pod(gpu_mem="4G"))
    assert not verdict.allowed
    assert "gpupool.io/gpu-mem counts 256 MiB units: 4000000000 is 954 PiB; for 4 GiB write 16" in verdict.reason


def test_without_rewriting_a_size_is_judged_as_the_count_it_is() -> None:
    verdict = admission().review(limits_pod(gpu_mem="4Gi"), rewrite=False)
    assert not verdict.allowed
    assert "4294967296 is 1 EiB; for 4 GiB write 16" in verdict.reason


# --------------------------------------------------------------------------------- never fits
@pytest.mark.parametrize(("pod_limits", "annotations", "reason"), [
    pytest.param({"gpu_core": 150}, None, "GPU compute is a percentage of one card (1..100), got 150",
                 id="compute-over-100"),
    pytest.param({"gpu_mem": 4096}, None, "gpupool.io/gpu-mem counts 256 MiB units: 4096 is 1 TiB; for 4 GiB write 16",
                 id="mib-habit"),
    pytest.param({"gpu_mem": "64Gi"}, None,
                 "container main asks for 65536 MiB on one card; the largest card has 40960 MiB",
                 id="bigger-than-every-card"),
    pytest.param({"gpu": 8}, None, "container main asks for 8 cards; the largest node has 4", id="more-cards"),
    pytest.param({"gpu_mem": "24Gi", "gpupool.io__gpu-shared": 4}, None,
                 "container main asks for 4 cards of 24576 MiB; no node has that many such cards (at most 2)",
                 id="shape-no-node-has"),
    pytest.param({"gpu": 4}, {"gpupool.io/gpu-models": "A100"},
                 "container main asks for 4 cards of a whole card, model A100; no node has that many such cards "
                 "(at most 2)", id="model-shape"),
    pytest.param({"gpu": 1}, {"gpupool.io/gpu-models": "H100"},
                 "container main asks for GPU model(s) H100; the cluster has A100, T4", id="unknown-model"),
])
def test_a_pod_gpupool_can_never_place_is_refused_with_the_reason(
        pod_limits: dict[str, Any], annotations: dict[str, str] | None, reason: str) -> None:
    verdict = admission().review(limits_pod(annotations, **pod_limits))
    assert not verdict.allowed
    assert reason in verdict.reason


def test_the_refusal_says_how_to_wait_for_nodes_to_come() -> None:
    verdict = admission().review(limits_pod(gpu_mem="64Gi"))
    assert verdict.reason.startswith("pod ml/p can never be placed on the nodes of this cluster: ")
    assert verdict.reason.endswith('annotate the pod gpupool.io/wait-for-nodes: "true"')


def test_a_pod_waiting_for_nodes_is_let_through() -> None:
    verdict = admission().review(limits_pod({"gpupool.io/wait-for-nodes": "true"}, gpu_mem="64Gi"))
    assert verdict.allowed and verdict.patch[0]["value"] == "256"


def test_the_cluster_is_judged_only_once_it_is_known() -> None:
    """Before the cache listed nodes, or with no GPU node yet, only the pod's own errors refuse it."""
    unsynced = ClusterCache(policy="binpack")
    assert admission(unsynced).review(limits_pod(gpu_mem="64Gi")).allowed
    assert not admission(unsynced).review(limits_pod(gpu_core=150)).allowed
    assert admission(world([node("cpu-only")])).review(limits_pod(gpu_mem="64Gi")).allowed


def test_fitting_pods_and_cpu_pods_pass_untouched() -> None:
    assert admission().review(limits_pod(gpu_mem=16, gpu_core=30)) == admission().review(limits_pod(cpu="1"))
    assert admission().review(limits_pod(gpu_mem=16)).allowed
    assert admission().review(limits_pod(gpu=4)).allowed


# ------------------------------------------------------------------ the pod-scheduler path
def post_pod_scheduler(raw: dict[str, Any]) -> dict[str, Any]:
    cache = world(SMALL_CLUSTER)
    api = AdmissionApi(QuotaAdmission(cache, cache.names), ExtenderMetrics(), BodyReader(),
                       steering=SchedulerSteering(cache.names))

    async def main() -> dict[str, Any]:
        async with TestClient(TestServer(api.app())) as client:
            resp = await client.post(POD_SCHEDULER_PATH, data=json.dumps(review(raw)).encode(),
                                     headers={"Content-Type": "application/json"})
            assert resp.status == 200
            answer: dict[str, Any] = json.loads(await resp.read())["response"]
            return answer

    return asyncio.run(main())


def test_the_mutating_answer_carries_the_counts_and_the_scheduler_in_one_patch() -> None:
    response = post_pod_scheduler(gpu_pod("p", "team-a", gpu_mem="4Gi"))
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "replace", "path": "/spec/containers/0/resources/limits/gpupool.io~1gpu-mem", "value": "16"},
        {"op": "add", "path": "/spec/schedulerName", "value": GPUPOOL_SCHEDULER}]
    assert response["warnings"] == ["gpupool: container main: gpupool.io/gpu-mem counts 256 MiB units: "
                                    "4Gi rewritten as 16 (4 GiB)"]


def test_the_mutating_webhook_refuses_what_can_never_be_placed() -> None:
    response = post_pod_scheduler(gpu_pod("p", "team-a", gpu_mem=4096))
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["message"].endswith("gpupool.io/gpu-mem counts 256 MiB units: 4096 is 1 TiB; "
                                                  "for 4 GiB write 16")


CONTAINER_KEYS = ["name", "resources", "limits", "requests", "gpupool.io/gpu-mem", "gpupool.io/gpu-core",
                  "gpupool.io/gpu", "containers", "initContainers", "annotations", "x"]
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2, 10**6) | st.sampled_from(["4Gi", "16", "c", "150", ""]),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(CONTAINER_KEYS),
                                                                                inner, max_size=4),
                    max_leaves=25)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(containers=JSON, annotations=JSON)
def test_any_pod_gets_a_verdict_never_an_exception(containers: Any, annotations: Any) -> None:
    """The webhook's answer for whatever the apiserver hands over before validating it (the review
    always names the pod): a crash would be a 500, and the pod-scheduler webhook fails closed."""
    raw = {"metadata": {"name": "p", "namespace": "ml", "annotations": annotations}, "spec": {"containers": containers}}
    verdict = admission().review(raw)
    assert verdict.allowed or verdict.reason
