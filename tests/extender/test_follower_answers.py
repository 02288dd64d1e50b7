"""What a replica that would not bind answers to kube-scheduler's verbs (issue 28, fail-over).

The Service routes kube-scheduler to the leader by its label, so a follower is called only through
a stale route: a label the dead leader could not take off, or a connection kube-scheduler kept open
from when the replica led (kube-proxy routes connections, not requests). Such a replica's filter
says at once, retryably, that it does not bind (before, it passed the pod and only the bind was
refused, after kube-scheduler had reserved the node), prioritize still scores (kube-scheduler
ignores a prioritize error anyway), bind refuses without writing, and each answer closes the
connection so kube-scheduler's next call goes through the Service again, to the leader.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest

from gpupool.api.names import ResourceNames
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.handover import CATCHING_UP, Unfenced
from gpupool.extender.http.api import NOT_LEADER, ExtenderApi, not_binding_error
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService
from gpupool.testing.fake_api import FakePodApi
from tests.extender.http_world import ALIBABA_NODES, ALIBABA_PODS, args
from tests.extender.modes import SHIPPED
from tests.kube.builders import container, pod

Verbs = Callable[[TestClient, FakePodApi, ExtenderMetrics], Awaitable[None]]


class CatchingUp:
    """The hand-over fence of a new term whose ledger has not caught up yet."""

    def admit(self) -> int | None:
        return None

    def holds(self, ticket: int) -> bool:
        return False

    def refusal(self) -> str:
        return CATCHING_UP


def replica(scenario: Verbs, *, leader: bool, catching_up: bool = False, binds: bool = True) -> None:
    """Run ``scenario`` against one replica on Alibaba's example: leading or not, its term caught up
    or not, with a binder or (``binds=False``) without."""

    async def main() -> None:
        api = FakePodApi()
        cache = ClusterCache(policy="binpack")
        cache.replace_nodes(ALIBABA_NODES)
        cache.replace_pods(ALIBABA_PODS)
        for p in ALIBABA_PODS:
            api.create_pod(p)
        fence = CatchingUp() if catching_up else Unfenced()
        service = ExtenderService(cache, Binder(cache, api, fence=fence) if binds else None,
                                  is_leader=lambda: leader, leader_name=lambda: "replica-0",
                                  bind_refusal=fence.refusal, settings=SHIPPED)
        metrics = ExtenderMetrics()
        async with TestClient(TestServer(ExtenderApi(service, ResourceNames(), metrics).app())) as client:
            await scenario(client, api, metrics)

    asyncio.run(main())


async def call(client: TestClient, verb: str, body: dict[str, Any]) -> tuple[Any, bool]:
    """The decoded answer and whether the server closed the connection after it."""
    resp = await client.post(f"/{verb}", json=body)
    assert resp.status == 200
    return await resp.json(), resp.headers.get("Connection", "").lower() == "close"


def counted(metrics: ExtenderMetrics, verb: str) -> float:
    line = f'gpupool_extender_requests_total{{outcome="{NOT_LEADER}",verb="{verb}"}}'
    for text in generate_latest(metrics.registry).decode().splitlines():
        if text.startswith(line):
            return float(text.rsplit(" ", 1)[1])
    return 0.0


def binding(name: str, node: str) -> dict[str, str]:
    """kube-scheduler's ExtenderBindingArgs for the pod made with ``uid=f"uid-{name}"``."""
    return {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": node}


def test_a_followers_filter_refuses_at_once_and_closes_the_connection() -> None:
    async def scenario(client: TestClient, api: FakePodApi, metrics: ExtenderMetrics) -> None:
        answer, closed = await call(client, "filter", args(pod("p", container(mib=8138))))
        assert answer["Error"] == not_binding_error("not the leader; the leader is replica-0")
        assert "not the leader" in answer["Error"] and "retry" in answer["Error"]
        assert not answer["NodeNames"]  # nothing passed: kube-scheduler reserves no node here
        assert closed
        assert counted(metrics, "filter") == 1

    replica(scenario, leader=False)


def test_a_followers_prioritize_still_scores_and_closes_the_connection() -> None:
    scores: dict[bool, Any] = {}

    def scenario(leading: bool) -> Verbs:
        async def run(client: TestClient, api: FakePodApi, metrics: ExtenderMetrics) -> None:
            answer, closed = await call(client, "prioritize", args(pod("p", container(mib=8138))))
            scores[leading] = answer
            assert closed is not leading
            assert counted(metrics, "prioritize") == (0 if leading else 1)
        return run

    replica(scenario(False), leader=False)
    replica(scenario(True), leader=True)
    assert scores[False] == scores[True]  # the same scores: kube-scheduler loses nothing


def test_a_followers_bind_is_refused_without_a_write_and_closes_the_connection() -> None:
    async def scenario(client: TestClient, api: FakePodApi, metrics: ExtenderMetrics) -> None:
        api.create_pod(pod("p", container(mib=1), uid="uid-p"))
        before = api.list_pods()
        answer, closed = await call(client, "bind", binding("p", "N3"))
        assert answer["Error"] == "this gpupool extender replica is not the leader; the leader is replica-0"
        assert closed
        assert api.list_pods() == before  # no assignment, no binding
        assert counted(metrics, "bind") == 1

    replica(scenario, leader=False)


def test_a_new_leader_catching_up_answers_like_a_follower() -> None:
    async def scenario(client: TestClient, api: FakePodApi, metrics: ExtenderMetrics) -> None:
        answer, closed = await call(client, "filter", args(pod("p", container(mib=8138))))
        assert answer["Error"] == not_binding_error(CATCHING_UP) and closed
        api.create_pod(pod("q", container(mib=1), uid="uid-q"))
        before = api.list_pods()
        answer, closed = await call(client, "bind", binding("q", "N3"))
        assert answer["Error"] == CATCHING_UP and closed
        assert api.list_pods() == before

    replica(scenario, leader=True, catching_up=True)


def test_the_leader_answers_and_keeps_the_connection() -> None:
    async def scenario(client: TestClient, api: FakePodApi, metrics: ExtenderMetrics) -> None:
        answer, closed = await call(client, "filter", args(pod("p", container(mib=8138))))
        assert answer["Error"] == "" and answer["NodeNames"] == ["N3"] and not closed
        api.create_pod(pod("p", container(mib=8138), uid="uid-p"))
        answer, closed = await call(client, "bind", binding("p", "N3"))
        assert answer["Error"] == "" and not closed
        assert counted(metrics, "filter") == counted(metrics, "bind") == 0

    replica(scenario, leader=True)


def test_an_extender_that_does_not_bind_filters_on_every_replica() -> None:
    """Without a bind verb (kube-scheduler binds) leadership does not matter to the filter."""
    async def scenario(client: TestClient, api: FakePodApi, metrics: ExtenderMetrics) -> None:
        answer, closed = await call(client, "filter", args(pod("p", container(mib=8138))))
        assert answer["Error"] == "" and answer["NodeNames"] == ["N3"] and not closed

    replica(scenario, leader=False, binds=False)


def test_a_followers_bind_refusal_does_not_wait_for_the_bind_threads() -> None:
    """A leader cut from the apiserver keeps its bind threads waiting on writes it began as leader;
    once it stepped down its refusals must not queue behind them (the partition e2e saw 8 s)."""
    async def main() -> None:
        api = FakePodApi()
        cache = ClusterCache(policy="binpack")
        cache.replace_nodes(ALIBABA_NODES)
        cache.replace_pods(ALIBABA_PODS)
        leading = [True]
        service = ExtenderService(cache, Binder(cache, api, fence=Unfenced()), is_leader=lambda: leading[0],
                                  leader_name=lambda: "replica-1", settings=SHIPPED)
        extender = ExtenderApi(service, ResourceNames(), ExtenderMetrics(), bind_workers=1)
        release = threading.Event()
        extender.pool.submit(release.wait, 30)  # the only bind thread waits on a write
        try:
            leading[0] = False  # the deadline passed: a follower now
            async with TestClient(TestServer(extender.app())) as client:
                answer, closed = await asyncio.wait_for(call(client, "bind", binding("p", "N3")), 5)
            assert answer["Error"] == "this gpupool extender replica is not the leader; the leader is replica-1"
            assert closed
        finally:
            release.set()

    asyncio.run(main())
