"""gpupool chooses the node for DRA claim pods (issue 24, docs/dra.md "Choosing between the
extender path and the DRA path"): a pending claim's asks of gpupool's cards, read from its spec,
become GPU containers of its pod's request, so the filter passes the node gpupool would pack them
on (one best, as for extended-resource pods), not the one CPU/memory spreading prefers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuRequest
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.extender.booking_keeper import ASSUMED_REFUSED
from gpupool.extender.cache import ClusterCache
from gpupool.extender.claim_pods import ClaimPodRequests
from gpupool.extender.dra_watch import apply_claim_event, replace_claims
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService
from gpupool.kube.claim_asks import ClaimAsk, claim_ask, pod_claim_names
from gpupool.kube.translate import TranslationError, pod_request
from tests.kube.builders import container, node, pod

DRIVER = "gpu.gpupool.io"
CLASSES = frozenset({DRIVER})
GIB = 1024  # MiB
CARD = 16 * GIB


def request(name: str = "gpu", memory: str | None = "4Gi", compute: str | None = None,
            count: int | None = None, device_class: str = DRIVER, **extra: Any) -> dict[str, Any]:
    asked = {k: v for k, v in (("memory", memory), ("compute", compute)) if v is not None}
    exactly: dict[str, Any] = {"deviceClassName": device_class, **extra}
    if asked:
        exactly["capacity"] = {"requests": asked}
    if count is not None:
        exactly["count"] = count
    return {"name": name, "exactly": exactly}


def claim(name: str, *requests: dict[str, Any], namespace: str = "team",
          allocated_on: tuple[str, str, str] | None = None) -> dict[str, Any]:
    """A claim; ``allocated_on``: (node, device, consumed memory) of its one allocation result."""
    obj: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
                           "spec": {"devices": {"requests": list(requests) or [request()]}}, "status": {}}
    if allocated_on is not None:
        pool, device, memory = allocated_on
        obj["status"] = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device,
             "consumedCapacity": {"memory": memory}}]}}}
    return obj


def claim_pod(name: str, *claims: str, namespace: str = "team", template: bool = False) -> dict[str, Any]:
    """A pod using ``claims`` (by name, or made from a template: then named in its status)."""
    obj = pod(name, {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "c0"}]}},
              namespace=namespace, uid=f"uid-{name}")
    named = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    if template:
        obj["spec"]["resourceClaims"] = [{"name": entry["name"], "resourceClaimTemplateName": "t"} for entry in named]
        obj["status"]["resourceClaimStatuses"] = named
    else:
        obj["spec"]["resourceClaims"] = named
    return obj


def world(*claims: dict[str, Any]) -> tuple[ClusterCache, ExtenderService, ClaimPodRequests]:
    """Two nodes of one 16 GiB card each, the claims watched; the shipped one-best filter."""
    cache = ClusterCache()
    cache.replace_nodes([node("n1", [CARD]), node("n2", [CARD])])
    cache.replace_pods([])
    replace_claims(cache, list(claims))
    return cache, ExtenderService(cache, None), ClaimPodRequests(cache.claims, cache.lock)


def chosen(cache: ClusterCache, service: ExtenderService, claims: ClaimPodRequests,
           obj: dict[str, Any], names: list[str] | None = None) -> list[str]:
    asked = claims.request(obj, pod_request(obj, ResourceNames()))
    out = service.filter(asked, names or ["n2", "n1"], pod=obj)
    assert not out.error
    cache.unassume(asked.key, ASSUMED_REFUSED)
    return out.passed


# ------------------------------------------------------------------------------- reading claims
def test_a_request_reads_as_memory_rounded_up_to_the_policy_step_and_compute_per_mille() -> None:
    ask = claim_ask(claim("c", request(memory="1000Mi", compute="30")), CLASSES)
    assert ask == ClaimAsk((("gpu", GpuRequest(compute=300, memory_mib=1024)),), named="gpu")


def test_two_requests_read_as_two_asks_and_count_applies_to_each_card() -> None:
    ask = claim_ask(claim("c", request("a", memory="4Gi"), request("b", memory="8Gi", count=2)), CLASSES)
    assert ask.asks == (("a", GpuRequest(memory_mib=4 * GIB)), ("b", GpuRequest(count=2, memory_mib=8 * GIB)))


def test_a_request_without_memory_is_a_whole_card_and_other_classes_ask_nothing() -> None:
    ask = claim_ask(claim("c", request("a", memory=None), request("nic", device_class="nic.example")), CLASSES)
    assert ask.asks == (("a", GpuRequest.whole()),) and ask.problem is None
    assert GpuRequest.whole().compute == COMPUTE_PER_CARD


@pytest.mark.parametrize(("req", "why"), [
    pytest.param(request(allocationMode="All"), "allocationMode", id="all-mode"),
    pytest.param(request(count=0), "count", id="zero-count"),
    pytest.param(request(memory="lots"), "memory", id="bad-memory"),
    pytest.param(request(compute="130"), "compute", id="too-much-compute"),
    pytest.param({"name": "x", "firstAvailable": [{"name": "s", "deviceClassName": DRIVER}]}, "firstAvailable",
                 id="first-available"),
])
def test_what_cannot_be_modelled_is_a_problem_not_an_exception(req: dict[str, Any], why: str) -> None:
    ask = claim_ask(claim("c", req), CLASSES)
    assert ask.asks == () and ask.problem is not None and why in ask.problem


def test_a_pods_claims_resolve_by_name_and_through_its_status_for_templates() -> None:
    assert pod_claim_names(claim_pod("p", "x", "y")) == (("c0", "x"), ("c1", "y"))
    assert pod_claim_names(claim_pod("p", "made-x", template=True)) == (("c0", "made-x"),)
    unmade = claim_pod("p", "made-x", template=True)
    unmade["status"]["resourceClaimStatuses"] = []
    assert pod_claim_names(unmade) == (("c0", ""),)


# ------------------------------------------------------------------------------- the node choice
def test_a_small_claim_joins_the_partly_used_card_instead_of_the_empty_node() -> None:
    cache, service, claims = world(claim("held", allocated_on=("n1", "gpu-0", "8Gi")), claim("new"))
    assert chosen(cache, service, claims, claim_pod("p", "new")) == ["n1"]


def test_a_claim_of_two_requests_goes_where_both_fit() -> None:
    both = claim("two", request("a", memory="4Gi"), request("b", memory="8Gi"))
    cache, service, claims = world(claim("held", allocated_on=("n1", "gpu-0", "8Gi")), both)
    assert chosen(cache, service, claims, claim_pod("p", "two")) == ["n2"]  # 12 GiB: n1 has 8 free
    smaller = claim("two", request("a", memory="4Gi"), request("b", memory="4Gi"))
    apply_claim_event(cache, "MODIFIED", smaller)
    assert chosen(cache, service, claims, claim_pod("p", "two")) == ["n1"]


def test_the_choice_is_among_the_nodes_kube_scheduler_passed() -> None:
    cache, service, claims = world(claim("held", allocated_on=("n1", "gpu-0", "8Gi")), claim("new"))
    assert chosen(cache, service, claims, claim_pod("p", "new"), names=["n2"]) == ["n2"]


def test_a_claim_from_a_template_is_read_through_the_pods_status() -> None:
    cache, service, claims = world(claim("held", allocated_on=("n1", "gpu-0", "8Gi")), claim("p-gpu-x1"))
    assert chosen(cache, service, claims, claim_pod("p", "p-gpu-x1", template=True)) == ["n1"]


def test_a_claim_no_node_can_hold_is_refused_with_the_reason() -> None:
    _cache, service, claims = world(claim("big", request(memory="20Gi")))
    obj = claim_pod("p", "big")
    out = service.filter(claims.request(obj, pod_request(obj, ResourceNames())), ["n1", "n2"], pod=obj)
    assert out.passed == [] and set(out.failed) == {"n1", "n2"}


def test_pods_without_gpupool_claims_are_unaffected() -> None:
    _cache, service, claims = world(claim("nic", request(device_class="nic.example")))
    plain = pod("plain", container(mib=1000), namespace="team", uid="u1")
    base = pod_request(plain, ResourceNames())
    assert claims.request(plain, base) is base
    nic = claim_pod("p", "nic")
    nic_base = pod_request(nic, ResourceNames())
    assert claims.request(nic, nic_base) is nic_base
    assert service.filter(nic_base, ["n2", "n1"]).passed == ["n2", "n1"]  # no opinion: every node


def test_an_allocated_claim_adds_nothing_and_one_not_modelled_leaves_the_pod_as_it_was() -> None:
    _cache, _service, claims = world(claim("held", allocated_on=("n1", "gpu-0", "8Gi")),
                                   claim("odd", request(allocationMode="All")))
    for name in ("held", "odd"):
        obj = claim_pod("p", name)
        base = pod_request(obj, ResourceNames())
        assert claims.request(obj, base) is base


def test_a_claim_not_seen_yet_is_an_error_to_retry_not_a_guess() -> None:
    cache, _service, claims = world()
    obj = claim_pod("p", "unseen")
    with pytest.raises(TranslationError, match="not in the extender's cache yet"):
        claims.request(obj, pod_request(obj, ResourceNames()))
    apply_claim_event(cache, "ADDED", claim("unseen"))
    assert len(claims.request(obj, pod_request(obj, ResourceNames())).gpu_containers) == 1
    apply_claim_event(cache, "DELETED", claim("unseen"))
    with pytest.raises(TranslationError):
        claims.request(obj, pod_request(obj, ResourceNames()))


# ------------------------------------------------------------------------------- over HTTP
def post(api: ExtenderApi, verb: str, body: dict[str, Any]) -> Any:
    async def main() -> Any:
        async with TestClient(TestServer(api.app())) as client:
            answer = await client.post(f"/{verb}", data=json.dumps(body))
            assert answer.status == 200
            return await answer.json()

    return asyncio.run(main())


def test_filter_and_prioritize_read_the_claims_when_the_api_is_given_them() -> None:
    cache, service, claims = world(claim("held", allocated_on=("n1", "gpu-0", "8Gi")), claim("new"))
    body = {"Pod": claim_pod("p", "new"), "NodeNames": ["n2", "n1"]}
    with_claims = ExtenderApi(service, ResourceNames(), ExtenderMetrics(), claim_pods=claims)
    assert post(with_claims, "filter", body)["NodeNames"] == ["n1"]
    cache.unassume("team/p", ASSUMED_REFUSED)
    apply_claim_event(cache, "ADDED", claim("big", request(memory="12Gi")))  # n1 has 8 GiB free
    big = {"Pod": claim_pod("b", "big"), "NodeNames": ["n2", "n1"]}
    assert {h["Host"]: h["Score"] for h in post(with_claims, "prioritize", big)} == {"n1": 0, "n2": 10}
    without = ExtenderApi(service, ResourceNames(), ExtenderMetrics())
    assert post(without, "filter", body)["NodeNames"] == ["n2", "n1"]  # the claim is not read: no opinion
    unseen = {"Pod": claim_pod("q", "unseen"), "NodeNames": ["n2", "n1"]}
    assert "not in the extender's cache yet" in post(with_claims, "filter", unseen)["Error"]
