"""An extender behind aiohttp's test client on a fake API, seeded with Alibaba's worked example."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gpupool.api.names import ResourceNames
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService, ExtenderSettings
from gpupool.testing.fake_api import FakePodApi
from tests.extender.modes import SHIPPED
from tests.kube.builders import node, placed_pod

Scenario = Callable[[TestClient, FakePodApi, ClusterCache], Awaitable[None]]

# Alibaba's worked example: three nodes with two 16,276 MiB cards each.
# N1: GPU0 full, GPU1 4,069 free; N2: 4,069 free on each card; N3: GPU0 8,138 free, GPU1 full.
ALIBABA_NODES = [node(n, [16276, 16276]) for n in ("N1", "N2", "N3")]
ALIBABA_PODS = [
    placed_pod("n1a", "N1", 0, 16276),
    placed_pod("n1b", "N1", 1, 12207),
    placed_pod("n2a", "N2", 0, 12207),
    placed_pod("n2b", "N2", 1, 12207),
    placed_pod("n3a", "N3", 0, 8138),
    placed_pod("n3b", "N3", 1, 16276),
]


def run(
    scenario: Scenario,
    *,
    synced: bool = True,
    nodes: list[dict[str, Any]] | None = None,
    pods: list[dict[str, Any]] | None = None,
    policy: str = "binpack",
    leader: bool = True,
    latency: float = 0.0,
    settings: ExtenderSettings = SHIPPED,
) -> None:
    """Run ``scenario`` against an extender app; nodes and pods default to Alibaba's example, the
    mode to the shipped one (:mod:`tests.extender.modes`)."""

    async def main() -> None:
        api = FakePodApi(latency_s=latency)
        cache = ClusterCache(policy=policy)
        if synced:
            cache.replace_nodes(ALIBABA_NODES if nodes is None else nodes)
            cache.replace_pods(ALIBABA_PODS if pods is None else pods)
            for p in ALIBABA_PODS if pods is None else pods:
                api.create_pod(p)
        api.listeners.append(lambda kind, p: cache.upsert_pod(p))
        service = ExtenderService(
            cache, Binder(cache, api), is_leader=lambda: leader, leader_name=lambda: "replica-0", settings=settings
        )
        app = ExtenderApi(service, ResourceNames(), ExtenderMetrics(ledger=cache), requests=cache.requests).app()
        async with TestClient(TestServer(app)) as client:
            await scenario(client, api, cache)

    asyncio.run(main())


def args(p: dict[str, Any], names: list[str] | None = None, *, full: bool = False) -> dict[str, Any]:
    """``ExtenderArgs`` for ``p``: node names (``nodeCacheCapable``) or, with ``full``, Node objects."""
    names = names or ["N1", "N2", "N3"]
    if full:
        return {"Pod": p, "Nodes": {"items": [node(n, [16276, 16276]) for n in names]}, "NodeNames": None}
    return {"Pod": p, "Nodes": None, "NodeNames": names}


async def post(client: TestClient, path: str, body: Any) -> tuple[int, Any]:
    """POST ``body`` (JSON-encoded unless already text) and return the status and decoded answer."""
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    resp = await client.post(path, data=data)
    return resp.status, await resp.json()


def post_filter(service: ExtenderService, body: dict[str, Any]) -> dict[str, Any]:
    """The filter answer kube-scheduler decodes for ``body``, from ``service`` behind the HTTP adapter."""
    async def main() -> dict[str, Any]:
        app = ExtenderApi(service, ResourceNames(), ExtenderMetrics()).app()
        async with TestClient(TestServer(app)) as client:
            answer = await client.post("/filter", data=json.dumps(body))
            assert answer.status == 200
            doc: dict[str, Any] = await answer.json()
            return doc

    return asyncio.run(main())
