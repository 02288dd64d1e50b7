"""Claims the ledger cannot square, end to end through HTTP: over-committed cards and unreadable
assignments take no new pods, show in ``/metrics`` and become Events on the pods involved."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpupool.api.names import ResourceNames
from gpupool.extender.binder import Binder
from gpupool.extender.bookings import OVERCOMMITTED, UNREADABLE
from gpupool.extender.cache import ClusterCache
from gpupool.extender.housekeeping import Housekeeping
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService, ExtenderSettings
from gpupool.testing.fake_api import FakePodApi
from tests.extender.modes import EVERY_FIT, SHIPPED
from tests.kube.builders import container, node, placed_pod, pod

GIB = 1024
CARD = 16 * GIB
ASSIGNMENT = "gpupool.io/assignment-v1"


class World:
    def __init__(self, client: TestClient, api: FakePodApi, cache: ClusterCache) -> None:
        self.client, self.api, self.cache = client, api, cache
        self.housekeeping = Housekeeping(cache, api)

    async def filter(self, mib: int, names: list[str]) -> dict[str, Any]:
        body = {"Pod": pod("next", container(mib=mib)), "NodeNames": names}
        resp = await self.client.post("/filter", data=json.dumps(body))
        assert resp.status == 200
        answer: dict[str, Any] = await resp.json()
        return answer

    async def bind(self, name: str, mib: int, node_name: str) -> str:
        created = self.api.create_pod(pod(name, container(mib=mib)))
        body = {"PodName": name, "PodNamespace": "default", "PodUID": created["metadata"]["uid"],
                "Node": node_name}
        resp = await self.client.post("/bind", data=json.dumps(body))
        error: str = (await resp.json())["Error"]
        return error

    async def gauge(self, name: str) -> float:
        text = await (await self.client.get("/metrics")).text()
        line = next(line for line in text.splitlines() if line.startswith(name + " "))
        return float(line.split()[1])

    def events(self, reason: str) -> list[str]:
        self.housekeeping.report()
        return sorted(e["involvedObject"]["name"] for e in self.api.events if e["reason"] == reason)


def run(nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
        scenario: Callable[[World], Awaitable[None]], settings: ExtenderSettings = SHIPPED) -> None:
    async def main() -> None:
        api = FakePodApi()
        cache = ClusterCache(policy="binpack")
        cache.replace_nodes(nodes)
        for p in pods:
            api.create_pod(p)
        cache.replace_pods(api.list_pods())
        api.listeners.append(lambda kind, p: cache.remove_pod(p) if kind == "DELETED" else cache.upsert_pod(p))
        service = ExtenderService(cache, Binder(cache, api), settings=settings)
        app = ExtenderApi(service, ResourceNames(), ExtenderMetrics(ledger=cache)).app()
        async with TestClient(TestServer(app)) as client:
            await scenario(World(client, api, cache))

    asyncio.run(main())


def test_two_claims_of_12_gib_on_a_16_gib_card_both_count_until_one_leaves() -> None:
    """Left by an older version or a hand edit: the ledger used to keep one claim, offer the other
    4 GiB to the next pod, and, once the kept claimant was deleted, forget the other one too, so a
    12 GiB pod landed beside it (28 GiB claimed on 16 GiB)."""
    async def scenario(world: World) -> None:
        cache = world.cache
        assert set(cache.state.placements) == {"default/a", "default/b"}
        assert cache.state.card_usage("n1")[0].memory_free == CARD - 24 * GIB
        assert set(cache.conflicts) == {"default/a", "default/b"}
        answer = await world.filter(4 * GIB, ["n1", "n2"])
        assert answer["NodeNames"] == ["n2"]  # the over-committed card takes nothing new
        assert "does not fit" in await world.bind("small", 4 * GIB, "n1")
        assert await world.gauge("gpupool_extender_overcommitted_cards") == 1.0
        assert world.events(OVERCOMMITTED) == ["a", "b"]
        assert world.events(OVERCOMMITTED) == ["a", "b"]  # reported once per pod, not on every pass

        world.api.delete_pod("default", "a")
        assert cache.state.card_usage("n1")[0].memory_free == CARD - 12 * GIB  # b still counts
        assert not cache.conflicts
        assert await world.gauge("gpupool_extender_overcommitted_cards") == 0.0
        assert (await world.filter(12 * GIB, ["n1"]))["NodeNames"] == []
        assert "does not fit" in await world.bind("big", 12 * GIB, "n1")
        assert await world.bind("fits", 4 * GIB, "n1") == ""

    run([node("n1", [CARD]), node("n2", [CARD])],
        [placed_pod("a", "n1", 0, 12 * GIB), placed_pod("b", "n1", 0, 12 * GIB)], scenario)


def test_a_whole_card_claimed_twice_stays_closed_when_one_holder_leaves() -> None:
    async def scenario(world: World) -> None:
        assert world.cache.overcommitted_cards() == 1
        world.api.delete_pod("default", "a")
        assert world.cache.overcommitted_cards() == 0
        assert (await world.filter(1 * GIB, ["n1"]))["NodeNames"] == []  # b still holds it whole

    def whole(name: str) -> dict[str, Any]:
        placed = placed_pod(name, "n1", 0, CARD)
        text = placed["metadata"]["annotations"][ASSIGNMENT].replace('"exclusive":false', '"exclusive":true')
        placed["metadata"]["annotations"][ASSIGNMENT] = text
        return placed

    run([node("n1", [CARD])], [whole("a"), whole("b")], scenario)


BAD_CARD = ('{"v":1,"node":"n1","time":"2024-05-01T10:00:00Z","containers":[{"name":"main","init":false,'
            '"cards":[{"index":5,"uuid":"GPU-n1-5","memoryMiB":4096,"computeMilli":0,"exclusive":false}]}]}')


@pytest.mark.parametrize("assignment", [
    pytest.param("{not json", id="garbage"),
    pytest.param(BAD_CARD, id="a-card-the-node-does-not-have"),
])
def test_a_bound_pod_whose_assignment_cannot_be_read_keeps_gpu_pods_off_its_node(assignment: str) -> None:
    """Its cards are unknown; treating it as holding nothing put the next pod on them. Every node
    that fits is passed, with the others' reasons (:data:`EVERY_FIT`), so the answer shows the refusal."""
    async def scenario(world: World) -> None:
        answer = await world.filter(4 * GIB, ["n1", "n2"])
        assert answer["NodeNames"] == ["n2"]
        assert "default/broken" in answer["FailedNodes"]["n1"]
        assert "cannot read" in answer["FailedNodes"]["n1"]
        assert "cannot read" in await world.bind("next-pod", 4 * GIB, "n1")
        assert await world.gauge("gpupool_extender_unreadable_assignments") == 1.0
        assert world.events(UNREADABLE) == ["broken"]
        world.api.delete_pod("default", "broken")
        assert (await world.filter(4 * GIB, ["n1", "n2"]))["NodeNames"] == ["n1", "n2"]
        assert await world.gauge("gpupool_extender_unreadable_assignments") == 0.0

    broken = pod("broken", container(mib=4 * GIB), node_name="n1", annotations={ASSIGNMENT: assignment})
    run([node("n1", [CARD, CARD]), node("n2", [CARD])], [broken], scenario, EVERY_FIT)
