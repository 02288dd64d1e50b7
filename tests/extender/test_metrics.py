"""The extender's ``/metrics``: cluster totals that match the ledger, a size that does not grow with the
cluster, and a scrape that neither renders under the ledger lock nor on the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import prometheus_client.exposition
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.core.model import CardMode, GpuCard
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.metrics import ExtenderMetrics, LedgerTotals
from gpupool.extender.service import ExtenderService
from gpupool.kube.translate import pod_request
from gpupool.testing.fake_api import FakePodApi
from tests.kube.builders import container, node, placed_pod, pod

Scenario = Callable[[TestClient, ClusterCache, ExtenderMetrics], Awaitable[None]]


def unhealthy_node(name: str, healthy: tuple[bool, ...]) -> dict[str, Any]:
    """A node whose inventory marks some cards unhealthy (16,000 MiB each)."""
    cards = tuple(GpuCard(i, f"GPU-{name}-{i}", "A100", 16000, healthy=h) for i, h in enumerate(healthy))
    doc = node(name)
    doc["metadata"]["annotations"]["gpupool.io/inventory-v1"] = encode_inventory(Inventory(cards))
    return doc


def mixed_cache() -> ClusterCache:
    """Slices, a whole card, an unhealthy card, a removed node and a node with a refused inventory."""
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("N1", [16276, 16276]), node("N2", [16276, 16276, 16276]),
                         unhealthy_node("N3", (True, False)), node("gone", [16276]),
                         node("broken", annotations={"gpupool.io/inventory-v1": '{"v": 1, "cards": 3}'})])
    cache.replace_pods([placed_pod("a", "N1", 0, 8138), placed_pod("b", "N1", 0, 4069),
                        placed_pod("c", "N2", 1, 12207), placed_pod("d", "gone", 0, 1000)])
    whole = cache.reserve(pod_request(pod("w", container(gpu=1)), cache.names), "N2")
    assert not hasattr(whole, "reason"), whole
    cache.remove_node("gone")
    return cache


def brute_force_totals(cache: ClusterCache) -> dict[str, Any]:
    """The same totals from the ledger's per-card view, one card at a time."""
    usages = [u for name, row in cache.state.index.items() if cache.state.present[row]
              for u in cache.state.card_usage(name)]
    states = {"idle": 0, "shared": 0, "exclusive": 0, "unhealthy": 0}
    for u in usages:
        states["unhealthy" if not u.healthy else CardMode(u.mode).name.lower()] += 1
    return {
        "cards": states,
        "memory_total": sum(u.memory_total for u in usages),
        "memory_allocated": sum(u.memory_total - u.memory_free for u in usages),
        "compute_total": sum(u.compute_total for u in usages),
        "compute_allocated": sum(u.compute_total - u.compute_free for u in usages),
    }


def test_totals_equal_the_sum_of_the_per_card_view() -> None:
    cache = mixed_cache()
    totals = LedgerTotals.read(cache)
    expected = brute_force_totals(cache)
    assert dict(totals.cards_by_state) == expected["cards"] == {
        "idle": 3, "shared": 2, "exclusive": 1, "unhealthy": 1}
    assert totals.memory_total_mib == expected["memory_total"] == 5 * 16276 + 2 * 16000
    assert totals.memory_allocated_mib == expected["memory_allocated"] == 8138 + 4069 + 12207 + 16276
    assert totals.compute_total_permille == expected["compute_total"] == 7 * 1000
    assert totals.compute_allocated_permille == expected["compute_allocated"] == 1000
    assert totals.nodes == 4 and totals.nodes_with_problem == 1
    assert totals.pods_booked == 4 and totals.synced


def serve(scenario: Scenario, cache: ClusterCache) -> None:
    async def main() -> None:
        api = FakePodApi(latency_s=0.2)
        for p in cache.pods.values():
            if p.raw is not None:
                api.create_pod(dict(p.raw))
        service = ExtenderService(cache, Binder(cache, api), is_leader=lambda: True, leader_name=lambda: "r")
        metrics = ExtenderMetrics(ledger=cache)
        app = ExtenderApi(service, ResourceNames(), metrics).app()
        async with TestClient(TestServer(app)) as client:
            await scenario(client, cache, metrics)

    asyncio.run(main())


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition text, by name and sorted labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await client.get("/metrics")
    assert response.status == 200
    return samples(await response.text())


def test_scrape_exports_the_totals_and_the_request_counts() -> None:
    async def scenario(client: TestClient, cache: ClusterCache, metrics: ExtenderMetrics) -> None:
        await client.post("/filter", json={"Pod": pod("p", container(mib=1)), "NodeNames": ["N1", "N2"]})
        await client.post("/filter", data="{")  # p, passed one node, is booked there (assumed) until its bind
        got = await scrape(client)
        assert got[("gpupool_extender_requests_total", (("outcome", "ok"), ("verb", "filter")))] == 1
        assert got[("gpupool_extender_requests_total", (("outcome", "bad_request"), ("verb", "filter")))] == 1
        assert got[("gpupool_extender_request_seconds_count", (("verb", "filter"),))] == 2
        assert got[("gpupool_extender_cache_synced", ())] == 1
        assert got[("gpupool_cluster_nodes", ())] == 4
        assert got[("gpupool_cluster_nodes_with_problem", ())] == 1
        assert got[("gpupool_cluster_pods_booked", ())] == 4 + 1
        assert got[("gpupool_extender_assumed_pods", ())] == 1
        mib = 1 << 20  # the series are in bytes, the ledger in MiB
        assert got[("gpupool_cluster_gpu_memory_total_bytes", ())] == (5 * 16276 + 2 * 16000) * mib
        assert got[("gpupool_cluster_gpu_memory_allocated_bytes", ())] == (8138 + 4069 + 12207 + 16276 + 1) * mib
        assert got[("gpupool_cluster_gpu_compute_total_cards", ())] == 7
        assert got[("gpupool_cluster_gpu_compute_allocated_cards", ())] == 1
        assert {labels: v for (name, labels), v in got.items() if name == "gpupool_cluster_cards"} == {
            (("state", "idle"),): 3, (("state", "shared"),): 2, (("state", "exclusive"),): 1,
            (("state", "unhealthy"),): 1}
        assert got[("gpupool_extender_binds_in_flight", ())] == 0

    serve(scenario, mixed_cache())


def test_series_do_not_grow_with_the_cluster() -> None:
    """Three nodes or fifty, one card or eight: the same series, only their values differ."""
    found: list[set[tuple[str, tuple[tuple[str, str], ...]]]] = []

    def cluster(nodes: int, cards: int) -> ClusterCache:
        cache = ClusterCache()
        cache.replace_nodes([node(f"n{i}", [16276] * cards) for i in range(nodes)])
        cache.replace_pods([placed_pod(f"p{i}", f"n{i}", 0, 1000) for i in range(nodes)])
        return cache

    async def scenario(client: TestClient, cache: ClusterCache, metrics: ExtenderMetrics) -> None:
        found.append(set(await scrape(client)))

    serve(scenario, cluster(3, 1))
    serve(scenario, cluster(50, 8))
    assert found[0] == found[1]
    assert not any(dict(labels).keys() & {"node", "card", "uuid"} for _, labels in found[0])


@pytest.mark.slow
def test_binds_in_flight_are_counted_while_the_api_answers() -> None:
    async def scenario(client: TestClient, cache: ClusterCache, metrics: ExtenderMetrics) -> None:
        bind = asyncio.create_task(client.post("/bind", json={
            "PodName": "p", "PodNamespace": "default", "PodUID": "uid-default-p", "Node": "N1"}))
        seen = []
        for _ in range(100):  # until the bind is in its thread (the fake API answers after 0.2 s)
            seen.append((await scrape(client))[("gpupool_extender_binds_in_flight", ())])
            if seen[-1] or bind.done():
                break
            await asyncio.sleep(0.01)
        assert seen[-1] == 1 and set(seen) <= {0, 1}
        assert (await bind).status == 200
        assert (await scrape(client))[("gpupool_extender_binds_in_flight", ())] == 0

    cache = mixed_cache()
    cache.upsert_pod(pod("p", container(mib=1000)))
    serve(scenario, cache)


# ------------------------------------------------------------------------------- the ledger lock


class TracedLock:
    """A re-entrant lock that counts its acquisitions and says whether some thread holds it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.depth = 0
        self.acquisitions = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self.depth += 1
            self.acquisitions += 1
        return got

    def release(self) -> None:
        self.depth -= 1
        self._lock.release()

    def __enter__(self) -> TracedLock:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    @property
    def held(self) -> bool:
        return self.depth > 0


@pytest.fixture
def traced_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ClusterCache, TracedLock, list[str]]]:
    """A cache whose lock is traced, and a log of every rendering step taken while it was held:
    a metric family or sample built, a sample value written as text."""
    cache = mixed_cache()
    lock = TracedLock()
    cache.lock = lock  # type: ignore[assignment]
    under_lock: list[str] = []

    def traced(owner: Any, attribute: str) -> None:
        original = getattr(owner, attribute)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if lock.held:
                under_lock.append(attribute)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, attribute, wrapper)

    traced(Metric, "__init__")
    traced(GaugeMetricFamily, "add_metric")
    traced(prometheus_client.exposition, "floatToGoString")
    yield cache, lock, under_lock


def test_a_scrape_takes_the_lock_once_and_renders_nothing_under_it(
    traced_cache: tuple[ClusterCache, TracedLock, list[str]],
) -> None:
    cache, lock, under_lock = traced_cache
    metrics = ExtenderMetrics()
    metrics.watch_ledger(cache)
    before = lock.acquisitions
    text = prometheus_client.exposition.generate_latest(metrics.registry).decode()
    assert "gpupool_cluster_gpu_memory_allocated_bytes" in text  # the totals were rendered ...
    assert lock.acquisitions - before == 1  # ... from one hold of the lock (a consistent copy) ...
    assert under_lock == []  # ... during which no family, sample or text was made
    assert not lock.held


class BlockingProbe(Collector):
    """A collector that records its thread and blocks until told to go on (or gives up)."""

    def __init__(self) -> None:
        self.thread: int | None = None
        self.entered = threading.Event()
        self.go_on = threading.Event()

    def collect(self) -> Iterator[Metric]:
        self.thread = threading.get_ident()
        self.entered.set()
        self.go_on.wait(10)
        yield GaugeMetricFamily("probe", "probe", value=1)


def test_filter_is_answered_while_a_scrape_renders() -> None:
    """A scrape that takes as long as it takes (here: until filter has answered) runs on a thread of
    its own, so filter and prioritize are served meanwhile. Rendering on the event loop would leave
    the filter unanswered until the probe gave up."""
    probe = BlockingProbe()

    async def scenario(client: TestClient, cache: ClusterCache, metrics: ExtenderMetrics) -> None:
        metrics.registry.register(probe)
        scraping = asyncio.create_task(client.get("/metrics"))
        assert await asyncio.to_thread(probe.entered.wait, 10)
        body = {"Pod": pod("p", container(mib=1)), "NodeNames": ["N1", "N2"]}
        answer = await asyncio.wait_for(client.post("/filter", json=body), 5)
        assert len((await answer.json())["NodeNames"]) == 1  # the shipped mode's one best node
        assert not scraping.done()
        probe.go_on.set()
        assert (await scraping).status == 200
        assert probe.thread != threading.get_ident()

    serve(scenario, mixed_cache())
