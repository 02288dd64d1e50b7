"""Filter+prioritize round trips against the extender in a forked process, with and without a
``/metrics`` scraper, and the cost of one scrape in process (see bench/extender.py)."""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import generate_latest

from bench.extender_cluster import SHAPES, pod_json
from gpupool.api.names import ResourceNames
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService, ExtenderSettings
from gpupool.kube.tenancy import pod_tenancy
from gpupool.kube.translate import pod_request


class RecordingMetrics(ExtenderMetrics):
    """Metrics that also keep each request's server-side duration (handler entry to response)."""

    def __init__(self) -> None:
        super().__init__()
        self.server_ms: list[float] = []

    def observe(self, verb: str, outcome: str, seconds: float) -> None:
        super().observe(verb, outcome, seconds)
        self.server_ms.append(seconds * 1000)


def _serve_forked(cache: ClusterCache, port: int, ready: Any, best_only: bool = False) -> None:
    """Child process: the extender app over the parent's cache (copied by fork), plus a bench route
    that books a pod on a node (the ledger change a bind would make) and one that hands back the
    server-side timings. The parent is then a client in another process, as kube-scheduler is."""
    from aiohttp import web

    # every node that fits, or (best_only) every best node: the modes this bench has always measured,
    # not the shipped one best node (bench/e2e_scheduling.py measures that, through kube-scheduler)
    service = ExtenderService(cache, None, settings=ExtenderSettings(filter_best_only=best_only, filter_one_best=False))
    metrics = RecordingMetrics()
    metrics.watch_ledger(cache)
    app = ExtenderApi(service, ResourceNames(), metrics, requests=cache.requests).app()

    async def book(request: web.Request) -> web.Response:
        doc = await request.json()
        pod = doc["pod"]
        cache.reserve(pod_request(pod, cache.names), doc["node"], pod_tenancy(pod, cache.tenancy.names))
        return web.Response(text="ok")

    async def server_ms(_request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(metrics.server_ms), content_type="application/json")

    app.router.add_post("/bench/book", book)
    app.router.add_get("/bench/server-ms", server_ms)

    async def main() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


class TimedLock:
    """A re-entrant lock that records how long each outermost hold lasted (seconds)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._since = 0.0
        self.holds: list[float] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._depth += 1
            if self._depth == 1:
                self._since = time.perf_counter()
        return got

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.holds.append(time.perf_counter() - self._since)
        self._lock.release()

    def __enter__(self) -> TimedLock:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def scrape_cost(cache: ClusterCache, rounds: int = 3) -> dict[str, float]:
    """Scrape the ledger's metrics in this process: the longest ledger-lock hold and the median
    duration of a whole scrape (collect and render), in ms, and the size of the text."""
    metrics = ExtenderMetrics()
    metrics.watch_ledger(cache)
    real, timed = cache.lock, TimedLock()
    cache.lock = timed  # type: ignore[assignment]
    try:
        took = []
        for _ in range(rounds):
            started = time.perf_counter()
            text = generate_latest(metrics.registry)
            took.append(time.perf_counter() - started)
    finally:
        cache.lock = real
    return {"lock_hold_ms": 1000 * max(timed.holds, default=0.0),
            "render_ms": 1000 * statistics.median(took), "bytes": len(text)}


class Scraper(threading.Thread):
    """GETs ``/metrics`` every ``interval`` seconds on its own connection until stopped."""

    def __init__(self, port: int, interval: float) -> None:
        super().__init__(name="bench-scraper", daemon=True)
        self.port = port
        self.interval = interval
        self.stop = threading.Event()
        self.durations_ms: list[float] = []

    def run(self) -> None:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            while not self.stop.is_set():
                started = time.perf_counter()
                conn.request("GET", "/metrics")
                answer = conn.getresponse()
                answer.read()
                if answer.status != 200:
                    raise RuntimeError(f"/metrics answered {answer.status}")
                self.durations_ms.append((time.perf_counter() - started) * 1000)
                self.stop.wait(max(0.0, started + self.interval - time.perf_counter()))
        finally:
            conn.close()


@dataclass(frozen=True)
class LatencyRuns:
    """Milliseconds per sample: round trips without and with scrapes, the handlers' own time (without
    scrapes), and each scrape's duration; ``filter``: the filter round trip alone (without scrapes)."""

    round_trip: list[float]
    server: list[float]
    round_trip_scraped: list[float]
    scrapes: list[float]
    filter: list[float]


def latency(
    cache: ClusterCache, names: list[str], samples: int, rng: random.Random, scrape_interval: float,
    pods: Callable[[int], dict[str, Any]] | None = None,
    best_only: bool = False,
) -> LatencyRuns:
    """Round-trip and server-side milliseconds of filter+prioritize, per sample; then the same
    number of samples again while a scraper reads ``/metrics`` (when ``scrape_interval`` > 0).
    ``best_only``: the extender's ``--filter-best-only`` and no prioritize (the configuration without
    ``prioritizeVerb``): each sample is the filter alone, and the pod is booked on its first passed node.

    The server runs in a forked child and the client is a plain keep-alive HTTP client here, so that
    neither the client's interpreter nor its JSON work shares the server's, as with kube-scheduler.
    Timed: from sending each request to reading each answer (encoding the request bodies and
    decoding the answers are kube-scheduler's work and are not timed). ``pods``: the pod of sample
    ``i`` (default: a random shape in namespace ``default``, without a group)."""
    import http.client
    import multiprocessing
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    child = context.Process(target=_serve_forked, args=(cache, port, ready, best_only), daemon=True)
    child.start()
    headers = {"Content-Type": "application/json"}
    try:
        if not ready.wait(60):
            raise RuntimeError("bench server did not start")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

        def exchange(path: str, body: bytes) -> bytes:
            conn.request("POST", path, body=body, headers=headers)
            return conn.getresponse().read()

        filters: list[float] = []

        def run(count: int, first: int) -> list[float]:
            round_trip: list[float] = []
            for i in range(first, first + count):
                pod = pods(i) if pods is not None else pod_json(f"bench-{i}", rng.choice(SHAPES))
                body = orjson.dumps({"Pod": pod, "NodeNames": names})
                started = time.perf_counter()
                answer = exchange("/filter", body)
                filtered = time.perf_counter() - started
                filters.append(filtered * 1000)
                passed = orjson.loads(answer)["NodeNames"]
                if best_only:
                    round_trip.append(filtered * 1000)
                    if passed:
                        exchange("/bench/book", orjson.dumps({"pod": pod, "node": passed[0]}))
                    continue
                body = orjson.dumps({"Pod": pod, "NodeNames": passed})
                started = time.perf_counter()
                answer = exchange("/prioritize", body)
                round_trip.append((filtered + time.perf_counter() - started) * 1000)
                scores = orjson.loads(answer)
                if scores:
                    best = max(scores, key=lambda e: e["Score"])["Host"]
                    exchange("/bench/book", orjson.dumps({"pod": pod, "node": best}))
            return round_trip

        warm = 20
        plain = run(samples + warm, 0)[warm:]
        scraped: list[float] = []
        scraper = Scraper(port, scrape_interval)
        if scrape_interval > 0:
            scraper.start()
            try:
                scraped = run(samples, samples + warm)
            finally:
                scraper.stop.set()
                scraper.join(120)
        conn.request("GET", "/bench/server-ms")
        per_request = orjson.loads(conn.getresponse().read())
        conn.close()
        per_sample = 1 if best_only else 2  # filter (and prioritize)
        pairs = [sum(per_request[j:j + per_sample]) for j in range(0, len(per_request) - per_sample + 1, per_sample)]
        return LatencyRuns(plain, pairs[warm:samples + warm], scraped, scraper.durations_ms,
                           filters[warm:samples + warm])
    finally:
        child.terminate()
        child.join(10)
