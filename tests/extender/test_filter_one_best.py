"""``--filter-one-best`` (with ``--filter-best-only``): filter passes one of the policy's best nodes,
the first in a fixed node order, and books the pod's cards there until its bind (``ASSUMED``), so
the next pod, filtered before that bind, decides on a ledger that holds it
(tests/extender/test_assumed_bookings.py covers the assumption's life).

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
from gpupool.extender.bookings import Stage
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.node_ranking import NOT_BEST, PREFERRED, TIED_NOT_FIRST
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
    assert service.cache.assumed_pods == 0  # nothing was passed alone, nothing assumed


def test_pods_filtered_before_any_bind_are_placed_one_after_the_other() -> None:
    """kube-scheduler filters the next pod while the last one's bind is on its way: each filter
    sees the pods assumed before it, so binpack fills node-3's two cards (four 4 GiB pods each),
    then goes on to node-1, the next in the order (the simulator's sequence), and no node is handed
    out beyond its cards."""
    service = ExtenderService(empty_cache(), None, settings=ONE_BEST)
    got = [passed(service, gpu_pod(f"p{i}")) for i in range(9)]
    assert got == [["node-3"]] * 8 + [["node-1"]]
    assert [u.memory_free for u in service.cache.state.card_usage("node-3")] == [0, 0]
    assert service.cache.assumed_pods == 9


def test_filtering_the_same_pod_again_gives_it_the_same_node() -> None:
    """A pod filtered twice (kube-scheduler retrying it) is not kept from the node it was passed:
    its own assumption is lifted before it is decided again."""
    service = ExtenderService(empty_cache(), None, settings=ONE_BEST)
    assert passed(service, gpu_pod("p1")) == ["node-3"]
    assert passed(service, gpu_pod("p1")) == ["node-3"]
    assert passed(service, gpu_pod("p2")) == ["node-3"]  # binpack: the card left beside p1
    assert passed(service, gpu_pod("p1")) == ["node-3"]
    assert service.cache.assumed_pods == 2


def test_a_refused_bind_ends_its_pods_assumption() -> None:
    """The bind of a pod the API does not have fails: its cards are free again."""
    _, cache, binder = world([node(name, [4096]) for name in NAMES])  # one 4 GiB pod fills a node
    service = ExtenderService(cache, binder, settings=ONE_BEST)
    assert passed(service, gpu_pod("p1")) == ["node-3"]
    assert service.bind("default", "p1", "uid-default-p1", "node-3").error
    assert "default/p1" not in cache.state.placements
    assert passed(service, gpu_pod("p2")) == ["node-3"]  # free again: the first in the order


def test_after_a_bind_the_ledger_decides_again() -> None:
    """The bind takes the assumed cards over; binpack then prefers the node alone."""
    api, cache, binder = world([node(name, [16384, 16384]) for name in NAMES])
    service = ExtenderService(cache, binder, settings=ONE_BEST)
    first = api.create_pod(gpu_pod("p1"))
    assert passed(service, first) == ["node-3"]
    assumed = cache.state.placements["default/p1"]
    result = service.bind("default", "p1", first["metadata"]["uid"], "node-3")
    assert not result.error and result.placement == assumed
    assert cache.assumed_pods == 0 and cache.assumption_ends["reserved"] == 1
    assert passed(service, gpu_pod("p2")) == ["node-3"]  # the fullest node, the unique best


def test_the_only_best_node_goes_to_the_next_pod_only_if_it_holds_both() -> None:
    """node-3 (one 16 GiB card, 4 GiB left) is binpack's only best node for a 4 GiB pod: p1 gets it,
    and p2, filtered before p1's bind, gets the first empty node at once: no wait, no bind that fails."""
    service = ExtenderService(one_card_cache(), None, settings=ONE_BEST)
    assert passed(service, gpu_pod("p1")) == ["node-3"]
    assert passed(service, gpu_pod("p2")) == ["node-1"]


def test_a_unique_best_node_is_passed_as_before_and_assumed() -> None:
    """Assumed too: the next pod, filtered before this one's bind, must not take it for free."""
    cache = empty_cache()
    cache.upsert_pod(placed_pod("other", "node-2", 0, 4096))
    service = ExtenderService(cache, None, settings=ONE_BEST)
    outcome = service.filter(request_of(cache, gpu_pod("p")), NAMES)
    assert outcome.passed == ["node-2"]
    assert set(outcome.failed) == set(NAMES) - {"node-2"}
    assert all(why.startswith("fits, but") for why in outcome.failed.values())
    booking = cache.bookings["default/p"]
    assert booking.stage is Stage.ASSUMED and booking.placement is not None and booking.placement.node == "node-2"


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
    """filter_one_best without best only (``--no-filter-best-only``, not the default) narrows
    nothing: filter passes every node that fits, and assumes nothing."""
    settings = ExtenderSettings(filter_best_only=False, filter_one_best=True)
    service = ExtenderService(empty_cache(), None, settings=settings)
    assert passed(service, gpu_pod("p")) == NAMES and service.cache.assumed_pods == 0


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


def test_the_http_filter_answers_the_next_pod_at_once_from_the_assumed_ledger() -> None:
    """Through HTTP: p2's filter, before p1's bind, is answered without waiting for that bind (the
    adapter used to poll for up to 250 ms), and with a node that holds it."""
    async def main() -> tuple[list[str], list[str], float]:
        service = ExtenderService(one_card_cache(), None, settings=ONE_BEST)
        app = ExtenderApi(service, ResourceNames(), ExtenderMetrics()).app()
        async with TestClient(TestServer(app)) as client:
            answers = []
            started = time.monotonic()
            for name in ("p1", "p2"):
                body = {"Pod": gpu_pod(name), "Nodes": None, "NodeNames": NAMES}
                answer = await client.post("/filter", data=json.dumps(body))
                answers.append((await answer.json())["NodeNames"])
            return answers[0], answers[1], time.monotonic() - started

    first, second, took = asyncio.run(main())
    assert (first, second) == (["node-3"], ["node-1"])
    assert took < 0.25


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
    assert passed(service, gpu_pod("q")) == ["node-3"]  # binpack: the card left beside p's assumed one
    cache.upsert_node(tainted("node-2", "PreferNoSchedule"))
    cache.remove_node("node-2")
    assert cache.soft_tainted == set()
