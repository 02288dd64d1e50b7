"""How many gpupool source files one request walks through (issue 22's "file-count walks").

    python3 bench/call_walk.py --json          # counts
    python3 bench/call_walk.py --list          # and the files, per walk
    python3 bench/call_walk.py --time --json   # and times: one /filter, a node's schedule checks

Follows the calls of

* ``filter``: one ``POST /filter`` to an in-process extender (aiohttp test server, the shipped
  settings, a fake pod API, four nodes of two 80 GiB cards);
* ``bind``: that pod's ``POST /bind`` (the binder chooses its cards, writes the assignment and
  binds through the fake API, whose watch event the cache then applies);
* ``node``: on the node side, a pod with its assignment reaching the node agent (the in-memory pod
  source standing in for its watch) and kubelet's admission of it, whose ``Allocate`` the agent
  answers (fake kubelet over real gRPC, fake GPUs; ``gpupool/testing/node_harness.py``); the
  files every one of three such pods entered (the agent's background pollers tick into some
  windows only);

and counts the distinct files under ``gpupool/`` whose Python functions were entered
(``sys.setprofile`` and ``threading.setprofile``: every thread, the bind pool's and the gRPC
server's included), leaving out the test stand-ins (``gpupool/testing``, ``gpupool/testenv``).
``bind_to_allocate`` is the union of ``bind`` and ``node``: the files one pod's path from the
extender's bind to the agent's Allocate enters. Each walk runs once untraced first (a warm-up pod),
so imports and first-call set-ups are not counted; background work of the agent that happens to
run in the window (its pollers) is counted, as it is part of what runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiohttp.test_utils import TestClient, TestServer

from bench.fidelity_scenario import NAMES, node_object, pod_object
from gpupool.core.model import ContainerRequest, GpuCard, GpuRequest, NodeSpec, PodRequest, Topology
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.kept_ledger import KeptLedger
from gpupool.nodeagent.pod_view import pod_view_from_json
from gpupool.nodeagent.schedule_check import check_assignment
from gpupool.testing.fake_api import FakePodApi
from gpupool.testing.node_harness import fake_pod, running_node
from gpupool.testing.node_workload import generate

PACKAGE = Path(__file__).resolve().parents[1] / "gpupool"
STAND_INS = (PACKAGE / "testing", PACKAGE / "testenv")
NODE_ROUNDS = 3


class FileWalk:
    """Records the gpupool files whose functions are entered while :meth:`recording` is open."""

    def __init__(self) -> None:
        self.active = False
        self.files: set[str] = set()
        self._seen: dict[str, bool] = {}

    def _counts(self, filename: str) -> bool:
        counted = self._seen.get(filename)
        if counted is None:
            path = Path(filename)
            counted = path.is_relative_to(PACKAGE) and not any(path.is_relative_to(s) for s in STAND_INS)
            self._seen[filename] = counted
        return counted

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.active and event == "call" and self._counts(frame.f_code.co_filename):
            self.files.add(str(Path(frame.f_code.co_filename).relative_to(PACKAGE.parent)))

    def install(self) -> None:
        """Profile this thread and every thread started from now on (the bind pool's, gRPC's)."""
        sys.setprofile(self.profile)
        threading.setprofile(self.profile)

    @contextmanager
    def recording(self) -> Iterator[set[str]]:
        self.files = set()
        self.active = True
        try:
            yield self.files
        finally:
            self.active = False


def gpu_pod(name: str) -> dict[str, Any]:
    """A pod asking for 30 % of one card (a shared slice: ``gpu-core``)."""
    request = PodRequest(key=name, containers=(
        ContainerRequest("main", cpu_milli=1000, memory_mib=1024, gpu=GpuRequest.fraction(300, 1)),))
    return pod_object(request)


def extender() -> tuple[FakePodApi, ExtenderApi, list[str]]:
    """The walks' extender: the shipped settings over a fake pod API and four nodes of two cards."""
    api = FakePodApi()
    cache = ClusterCache(NAMES, policy="binpack")
    nodes = [NodeSpec(f"n{i}", cpu_milli=64_000, memory_mib=256_000, cards=tuple(
        GpuCard(index=c, uuid=f"GPU-n{i}-{c}", model="A100", memory_mib=81_920) for c in range(2)))
        for i in range(4)]
    cache.replace_nodes([node_object(spec) for spec in nodes])
    cache.replace_pods([])
    api.listeners.append(lambda kind, p: cache.remove_pod(p) if kind == "DELETED" else cache.upsert_pod(p))
    service = ExtenderService(cache, Binder(cache, api))
    return api, ExtenderApi(service, NAMES, ExtenderMetrics(ledger=cache), requests=cache.requests), \
        [spec.name for spec in nodes]


async def extender_walks(walk: FileWalk) -> tuple[set[str], set[str]]:
    """The files of one /filter and of one /bind, after a warm-up pod through both."""
    api, served, names = extender()
    async with TestClient(TestServer(served.app())) as client:
        async def filter_and_bind(name: str) -> tuple[set[str], set[str]]:
            created = api.create_pod(gpu_pod(name))
            meta = created["metadata"]
            with walk.recording() as filtered:
                answer = await (await client.post("/filter", json={"Pod": created, "NodeNames": names})).json()
            (node,) = answer["NodeNames"]
            with walk.recording() as bound:
                done = await (await client.post("/bind", json={
                    "PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                    "Node": node})).json()
            if done.get("Error"):
                raise RuntimeError(f"bind refused: {done['Error']}")
            return set(filtered), set(bound)

        await filter_and_bind("warm-up")
        return await filter_and_bind("walked")


async def node_walk(walk: FileWalk, rounds: int = NODE_ROUNDS) -> set[str]:
    """The files every one of ``rounds`` assigned pods entered reaching the agent and its Allocate,
    after a warm-up pod (the intersection: the agent's pollers tick into some windows only)."""
    gpu_file, workload = generate(rounds + 1, cards=8, seed=0)
    warm, *walked = (p.json for p in workload)
    async with running_node(gpu_file) as node:
        async def admit(pod: dict[str, Any]) -> None:
            node.source.put(pod)
            await node.kubelet.handle_pod_additions([fake_pod(pod)])
            await node.kubelet.wait_idle(30)

        await admit(warm)
        every: set[str] | None = None
        for pod in walked:
            calls = len(node.agent.stats.allocate_ms)
            with walk.recording() as files:
                await admit(pod)
            if len(node.agent.stats.allocate_ms) <= calls:
                raise RuntimeError("a walked pod was admitted without an Allocate")
            every = set(files) if every is None else every & files
        return every or set()


async def filter_times(rounds: int) -> dict[str, float]:
    """Median microseconds of one /filter of one pod, asked ``rounds`` times (untraced): wall time
    through the in-process HTTP server, and this thread's CPU time in its handler alone (the verb
    without the transport; CPU time, so other load on the machine stretches it less). Each answer
    passes one node and books the pod there, lifting the pod's booking of the call before, so every
    round decides on the same ledger."""
    api, served, names = extender()
    doc = {"Pod": api.create_pod(gpu_pod("timed")), "NodeNames": names}
    handler = served._filter  # the handler the route calls, without aiohttp around it
    timed: dict[str, list[float]] = {"filter_http_us": [], "filter_handler_cpu_us": []}
    async with TestClient(TestServer(served.app())) as client:
        for _ in range(rounds):
            started = time.perf_counter()
            await (await client.post("/filter", json=doc)).read()
            timed["filter_http_us"].append((time.perf_counter() - started) * 1e6)
            started = time.thread_time()
            await handler(doc)
            timed["filter_handler_cpu_us"].append((time.thread_time() - started) * 1e6)
    return {name: round(statistics.median(values[rounds // 10:]), 1) for name, values in timed.items()}


def schedule_check_times(pods: int = 100, cards: int = 16, repeat: int = 5) -> dict[str, float]:
    """CPU milliseconds (this thread's, the best of ``repeat``) of the schedule checks of ``pods``
    pods admitted one after another on one node of ``cards`` cards, each container checked against
    the pods before it, with the agent's kept ledger (what Allocate runs, without gRPC around it)."""
    gpu_file, workload = generate(pods, cards=cards, seed=0)
    inventory = GpuInventory(tuple(GpuCard(i, c["uuid"], gpu_file["model"], c["memoryMiB"])
                                   for i, c in enumerate(gpu_file["cards"])),
                             Topology.flat(cards), tuple(f"/dev/nvidia{i}" for i in range(cards)))
    views = [pod_view_from_json(p.json, NAMES) for p in workload]
    best = float("inf")
    for _ in range(repeat):
        kept = KeptLedger("node-a")
        started = time.thread_time()
        for i, view in enumerate(views):
            assert view.assignment is not None
            for container in view.assignment.placement.containers:
                if container.slices:
                    check_assignment("node-a", inventory, view, container, views[:i], kept)
        best = min(best, (time.thread_time() - started) * 1000)
    return {"schedule_checks_cpu_ms": round(best, 1)}


def measure() -> dict[str, list[str]]:
    walk = FileWalk()
    walk.install()
    try:
        filtered, bound = asyncio.run(extender_walks(walk))
        node = asyncio.run(node_walk(walk))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return {"filter": sorted(filtered), "bind": sorted(bound), "node": sorted(node),
            "bind_to_allocate": sorted(bound | node)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON line of counts")
    parser.add_argument("--list", action="store_true", help="list the files of each walk")
    parser.add_argument("--time", action="store_true", help="also time one /filter (median of --rounds, untraced)")
    parser.add_argument("--rounds", type=int, default=3000)
    args = parser.parse_args()
    walks = measure()
    counts: dict[str, float] = {f"{name}_files": len(files) for name, files in walks.items()}
    if args.time:
        counts.update(asyncio.run(filter_times(args.rounds)))
        counts.update(schedule_check_times())
    if args.list:
        for name, files in walks.items():
            print(f"{name} ({len(files)} files):")
            for file in files:
                print(f"  {file}")
    if args.json:
        print(json.dumps(counts))
    elif not args.list:
        for name, count in counts.items():
            print(f"{name:<24} {count:>4}")


if __name__ == "__main__":
    main()
