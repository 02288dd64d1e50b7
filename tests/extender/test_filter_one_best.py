"""``--filter-one-best`` (with ``--filter-best-only``): filter passes one of the policy's best nodes,
the first in a fixed node order, skipping the nodes passed alone to pods whose bind has not come yet.

kube-scheduler v1.20 takes a single feasible node without scoring, so the pod lands where the
simulator (which breaks ties by a fixed node order too) would put it; a pod with soft preferences
still gets every best node, for kube-scheduler's plugins to weigh them.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpupool.api.names import ResourceNames
from gpupool.core.model import PodRequest
from gpupool.extender.best_nodes import NOT_BEST
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.one_best import IN_FLIGHT_WAIT_S, PREFERRED, TIED_NOT_FIRST
from gpupool.extender.service import ExtenderService, ExtenderSettings
from gpupool.kube.translate import pod_request
from tests.extender.binder_world import world
from tests.extender.http_world import post_filter
from tests.kube.builders import container, node, placed_pod, pod

NAMES = [f"node-{i}" for i in range(6)]
RANK = {"node-0": 50, "node-1": 20, "node-2": 60, "node-3": 10, "node-4": 40, "node-5": 30}
IN_RANK_ORDER = sorted(NAMES, key=RANK.__getitem__)
"""node-3, node-1, node-5, node-4, node-0, node-2: unrelated to the names' order."""
ONE_BEST = ExtenderSettings(filter_best_only=True, filter_one_best=True, tie_rank=RANK.__getitem__)
ALL_BEST = ExtenderSettings(filter_best_only=True, filter_one_best=False, tie_rank=RANK.__getitem__)
SOFT = {"nodeAffinity": {PREFERRED: [{"weight": 1, "preference": {
    "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}


def empty_cache(names: list[str] = NAMES) -> ClusterCache:
    """Identical empty nodes of two 16 GiB cards: every node ties for a pod under binpack."""
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node(name, [16384, 16384]) for name in names])
    cache.replace_pods([])
    return cache


def gpu_pod(name: str, affinity: dict[str, Any] | None = None) -> dict[str, Any]:
    obj = pod(name, container(gpu_mem=16))
    if affinity is not None:
        obj["spec"]["affinity"] = affinity
    return obj


def request_of(cache: ClusterCache, obj: dict[str, Any]) -> PodRequest:
    return pod_request(obj, cache.names)


def passed(service: ExtenderService, obj: dict[str, Any], names: list[str] = NAMES) -> list[str]:
    outcome = service.filter(pod_request(obj, ResourceNames()), names, pod=obj)
    assert outcome.error == ""
    return outcome.passed


def test_one_best_passes_only_the_tied_node_ranked_first() -> None:
    cache = empty_cache()
    outcome = ExtenderService(cache, None, settings=ONE_BEST).filter(request_of(cache, gpu_pod("p")), NAMES)
    assert outcome.passed == ["node-3"]
    assert outcome.rows is not None and outcome.rows.tolist() == [cache.state.index["node-3"]]


def test_all_best_passes_every_tied_node() -> None:
    cache = empty_cache()
    assert passed(ExtenderService(cache, None, settings=ALL_BEST), gpu_pod("p")) == NAMES


def test_a_pod_with_a_soft_preference_gets_every_tied_node() -> None:
    service = ExtenderService(empty_cache(), None, settings=ONE_BEST)
    assert passed(service, gpu_pod("p", SOFT)) == NAMES
    assert service.one_best.in_flight.holders(service.cache.state) == {}  # nothing was passed alone


def test_pods_filtered_before_any_bind_get_the_tied_nodes_in_rank_order() -> None:
    """kube-scheduler filters the next pod while the last one's bind is on its way: each gets the
    next node in the order, not the one already handed out."""
    service = ExtenderService(empty_cache(), None, settings=ONE_BEST)
    got = [passed(service, gpu_pod(f"p{i}")) for i in range(len(NAMES))]
    assert got == [[name] for name in IN_RANK_ORDER]
    assert passed(service, gpu_pod("one-more")) == ["node-3"]  # every node in flight: the order's first


def test_filtering_the_same_pod_again_gives_it_the_same_node() -> None:
    """A pod filtered twice (kube-scheduler retrying it) is not kept from the node it was passed."""
    service = ExtenderService(empty_cache(), None, settings=ONE_BEST)
    assert passed(service, gpu_pod("p1")) == ["node-3"]
    assert passed(service, gpu_pod("p1")) == ["node-3"]
    assert passed(service, gpu_pod("p2")) == ["node-1"]
    assert passed(service, gpu_pod("p1")) == ["node-3"]


def test_a_refused_bind_hands_its_node_back_to_the_order() -> None:
    """The bind of a pod the API does not have fails: its node is no longer in flight."""
    _, cache, binder = world([node(name, [16384, 16384]) for name in NAMES])
    service = ExtenderService(cache, binder, settings=ONE_BEST)
    assert passed(service, gpu_pod("p1")) == ["node-3"]
    assert service.bind("default", "p1", "uid-default-p1", "node-3").error
    assert passed(service, gpu_pod("p2")) == ["node-3"]


def test_after_a_bind_the_ledger_decides_again() -> None:
    """Once the bind booked the pod, the node is the ledger's: binpack now prefers it alone."""
    api, cache, binder = world([node(name, [16384, 16384]) for name in NAMES])
    service = ExtenderService(cache, binder, settings=ONE_BEST)
    first = api.create_pod(gpu_pod("p1"))
    assert passed(service, first) == ["node-3"]
    result = service.bind("default", "p1", first["metadata"]["uid"], "node-3")
    assert not result.error
    assert service.one_best.in_flight.holders(cache.state) == {}
    assert passed(service, gpu_pod("p2")) == ["node-3"]  # the fullest node, the unique best


def test_the_only_best_node_is_passed_though_in_flight_naming_the_pod_to_wait_for() -> None:
    cache = empty_cache()
    service = ExtenderService(cache, None, settings=ONE_BEST)
    assert passed(service, gpu_pod("p1")) == ["node-3"]
    cache.upsert_pod(placed_pod("other", "node-3", 0, 4096))  # node-3 now the only best for binpack
    outcome = service.filter(request_of(cache, gpu_pod("p2")), NAMES)
    assert outcome.passed == ["node-3"] and outcome.waits_for == "default/p1"
    again = service.filter(request_of(cache, gpu_pod("p2")), NAMES)  # p1's hold still counts
    assert again.passed == ["node-3"] and again.waits_for == "default/p1"


def test_a_unique_best_node_is_passed_as_before_and_held() -> None:
    """Held too: the next pod, filtered before this one's bind, must not take it for free."""
    cache = empty_cache()
    cache.upsert_pod(placed_pod("other", "node-2", 0, 4096))
    service = ExtenderService(cache, None, settings=ONE_BEST)
    outcome = service.filter(request_of(cache, gpu_pod("p")), NAMES)
    assert outcome.passed == ["node-2"] and outcome.waits_for == ""
    assert set(outcome.failed) == set(NAMES) - {"node-2"}
    assert all(why.startswith("fits, but") for why in outcome.failed.values())
    assert service.one_best.in_flight.holders(cache.state) == {cache.state.index["node-2"]: "default/p"}


def test_the_tied_nodes_not_passed_get_their_reason() -> None:
    """With reasons asked for beside passed nodes: the tied ones say why another was passed, the
    worse ones keep the best-only reason."""
    cache = empty_cache()
    tied = {"node-1", "node-2", "node-4", "node-5"}
    for name in tied:  # a card in use: binpack prefers these to the empty node-0 and node-3
        cache.upsert_pod(placed_pod(f"on-{name}", name, 0, 4096))
    service = ExtenderService(cache, None, settings=ONE_BEST)
    outcome = service.filter(request_of(cache, gpu_pod("p")), NAMES, reasons_if_passed=True)
    assert outcome.passed == ["node-1"]  # the first of the tied in rank order
    assert outcome.failed.keys() == set(NAMES) - {"node-1"}
    assert {n: outcome.failed[n] for n in tied - {"node-1"}} == dict.fromkeys(tied - {"node-1"}, TIED_NOT_FIRST)
    assert all(outcome.failed[n].startswith(NOT_BEST.split("{")[0]) for n in ("node-0", "node-3"))
    quiet = ExtenderService(cache, None, settings=ONE_BEST).filter(
        request_of(cache, gpu_pod("p")), NAMES, reasons_if_passed=False)
    assert quiet.passed == ["node-1"] and quiet.failed == {}


def test_the_default_order_is_the_same_for_every_replica() -> None:
    """Two services (two replicas, or one restarted) pass the same node by default."""
    settings = ExtenderSettings(filter_best_only=True, filter_one_best=True)
    answers = {tuple(passed(ExtenderService(empty_cache(), None, settings=settings), gpu_pod("p")))
               for _ in range(2)}
    assert len(answers) == 1 and len(next(iter(answers))) == 1


def test_one_best_needs_best_only() -> None:
    """filter_one_best alone narrows nothing: filter passes every node that fits."""
    service = ExtenderService(empty_cache(), None, settings=ExtenderSettings(filter_one_best=True))
    assert passed(service, gpu_pod("p")) == NAMES


def http_filter(settings: ExtenderSettings, obj: dict[str, Any], *, node_objects: bool = False) -> dict[str, Any]:
    """The filter answer kube-scheduler decodes (NodeNames, or whole Node objects without nodeCacheCapable)."""
    nodes = {"Nodes": {"items": [node(name, [16384, 16384]) for name in NAMES]}, "NodeNames": None}
    body = {"Pod": obj, **(nodes if node_objects else {"Nodes": None, "NodeNames": NAMES})}
    return post_filter(ExtenderService(empty_cache(), None, settings=settings), body)


def test_the_http_filter_answers_one_node_name() -> None:
    doc = http_filter(ONE_BEST, gpu_pod("p"))
    assert doc["NodeNames"] == ["node-3"] and doc["FailedNodes"] == {} and doc["Error"] == ""


def test_the_http_filter_answers_one_node_object_without_node_cache() -> None:
    doc = http_filter(ONE_BEST, gpu_pod("p"), node_objects=True)
    assert [n["metadata"]["name"] for n in doc["Nodes"]["items"]] == ["node-3"] and doc["Error"] == ""


@pytest.mark.parametrize(("settings", "affinity"), [
    pytest.param(ALL_BEST, None, id="all-best"),
    pytest.param(ONE_BEST, SOFT, id="pod-with-soft-preference"),
])
def test_the_http_filter_answers_every_tied_node(settings: ExtenderSettings, affinity: dict[str, Any] | None) -> None:
    """The pod object of the HTTP request is what the soft-preference check reads."""
    doc = http_filter(settings, gpu_pod("p", affinity))
    assert doc["NodeNames"] == NAMES


def one_card_cache() -> ClusterCache:
    """Nodes of one 16 GiB card; node-3's has 4 GiB left, so binpack's only best node for a 4 GiB pod."""
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node(name, [16384]) for name in NAMES])
    cache.replace_pods([placed_pod("other", "node-3", 0, 12288)])
    return cache


def http_filter_while(booking_after_s: float | None) -> tuple[list[str], float, dict[str, float | None]]:
    """p1 was passed node-3 (its only best node); p2's filter comes before p1's bind. The ledger books
    p1 after ``booking_after_s`` (None: not at all); p2's answer, how long it took, and the waits
    counted on ``/metrics`` by outcome."""
    metrics = ExtenderMetrics()

    async def main() -> tuple[list[str], float]:
        cache = one_card_cache()
        service = ExtenderService(cache, None, settings=ONE_BEST)
        assert passed(service, gpu_pod("p1")) == ["node-3"]
        app = ExtenderApi(service, ResourceNames(), metrics).app()
        body = {"Pod": gpu_pod("p2"), "Nodes": None, "NodeNames": NAMES}
        async with TestClient(TestServer(app)) as client:
            if booking_after_s is not None:  # what the bind's reservation does to the ledger
                asyncio.get_running_loop().call_later(booking_after_s, cache.upsert_pod,
                                                      placed_pod("p1", "node-3", 0, 4096))
            started = time.monotonic()
            answer = await client.post("/filter", data=json.dumps(body))
            took = time.monotonic() - started
            assert answer.status == 200
            doc: dict[str, Any] = await answer.json()
            return doc["NodeNames"], took

    names, took = asyncio.run(main())
    waits = {outcome: metrics.registry.get_sample_value("gpupool_extender_filter_in_flight_waits_total",
                                                        {"outcome": outcome}) for outcome in ("booked", "timed_out")}
    return names, took, waits


def test_a_filter_waits_for_the_booking_of_its_only_best_node_and_asks_again() -> None:
    """Once p1 is booked, node-3 has no room for p2: p2 gets the first empty node instead of a
    bind that would fail."""
    names, took, waits = http_filter_while(IN_FLIGHT_WAIT_S / 5)
    assert names == ["node-1"]
    assert took < IN_FLIGHT_WAIT_S  # the wait ended with the booking, not with the timeout
    assert waits == {"booked": 1.0, "timed_out": None}


def test_a_filter_passes_its_only_best_node_when_the_booking_does_not_come_in_time() -> None:
    names, took, waits = http_filter_while(None)
    assert names == ["node-3"]
    assert took >= IN_FLIGHT_WAIT_S  # it did wait
    assert waits == {"booked": None, "timed_out": 1.0}


def tainted(name: str, effect: str) -> dict[str, Any]:
    obj = node(name, [16384, 16384])
    obj["spec"] = {"taints": [{"key": "maintenance", "value": "soon", "effect": effect}]}
    return obj


@pytest.mark.parametrize(("effect", "one"), [
    pytest.param("PreferNoSchedule", False, id="prefer-no-schedule-leaves-the-choice-to-kube-scheduler"),
    pytest.param("NoSchedule", True, id="no-schedule-is-kube-schedulers-filter"),
])
def test_a_best_node_with_a_soft_taint_gives_the_pod_every_best_node(effect: str, one: bool) -> None:
    cache = empty_cache()
    cache.upsert_node(tainted("node-0", effect))
    service = ExtenderService(cache, None, settings=ONE_BEST)
    assert passed(service, gpu_pod("p")) == (["node-3"] if one else NAMES)


def test_the_soft_taint_counts_while_the_node_has_it() -> None:
    cache = empty_cache()
    service = ExtenderService(cache, None, settings=ONE_BEST)
    cache.upsert_node(tainted("node-0", "PreferNoSchedule"))
    assert passed(service, gpu_pod("p"), ["node-1", "node-3"]) == ["node-3"]  # no tainted node among the best
    cache.upsert_node(node("node-0", [16384, 16384]))  # the taint went
    assert passed(service, gpu_pod("q")) == ["node-1"]  # node-3 is in flight for p
    cache.upsert_node(tainted("node-2", "PreferNoSchedule"))
    cache.remove_node("node-2")
    assert cache.soft_tainted == set()
