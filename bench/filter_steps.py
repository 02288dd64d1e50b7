"""Where one ``/filter`` of the extender spends its CPU, step by step, in process.

    python3 bench/filter_steps.py --json
    python3 bench/filter_steps.py --nodes 1000 --pods 300 --json

The cluster and pods of bench/e2e_scheduling.py without the cluster around them: ``--nodes`` nodes
of 8 cards of the bundled cluster's most common machine (bench/e2e_objects.py), the extender's
shipped settings (best only, one best node) and policy, scoring against the bundled trace's
workload profile, and the trace's first ``--pods`` GPU pods. Each pod is created in a fake pod API
(whose events the cache applies, as the pod watch would), filtered with every node's name in a new
random order (kube-scheduler v1.37 sends its feasible nodes in a different order every cycle) and
bound where the filter sent it (the binder, through the fake API).

A filter is the request body (the JSON kube-scheduler sends, ``nodeCacheCapable``) decoded as the
HTTP layer decodes it, then the handler the route calls (``ExtenderApi._filter``) without aiohttp
around it. Each step is this thread's CPU time (``time.thread_time``; other load on the machine
stretches CPU time less than wall time) around the function that does it:

* ``decode``: the body's JSON (orjson), ``parse``: reading the ``ExtenderArgs`` out of it;
* ``request``: the pod's translation and tenancy (a memo: the pod's watch event translated it);
* ``lapsed``: ending lapsed assumptions and the pod's own earlier one; ``admit``: its group and quotas;
* ``rows``: mapping the node names to ledger rows (``NodeRows.rows``);
* ``core``: the core's feasibility and scores (``Scheduler.filter_and_score``);
* ``best``: the best nodes and the one among them; ``assume``: booking the pod where it was sent;
* ``answer``: the answer's node list; ``other``: the rest of the handler (reasons, masks, memos).

Medians and means over the pods after the first tenth (warm-up), in ms per filter; the mean is
what a filter costs on average (the core's rescoring of a shape it has not seen is rare and long).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

import gpupool.extender.http.api as http_api
import gpupool.extender.service as service_module
from bench.e2e_objects import common_shape, gpu_pods, node_manifest, node_spec, pod_manifest
from gpupool.api.names import ResourceNames
from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.gc_freeze import freeze_long_lived
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.http.wire import parse_extender_args
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.node_ranking import best_nodes
from gpupool.extender.service import ExtenderService
from gpupool.sim.trace import load_pods, resolve_trace
from gpupool.testing.fake_api import FakePodApi

TRACE = "default"
STEPS = ("decode", "parse", "request", "lapsed", "admit", "rows", "core", "best", "assume", "answer")


class StepClock:
    """Adds this thread's CPU time inside wrapped functions to the step they belong to."""

    def __init__(self) -> None:
        self.spent: dict[str, int] = defaultdict(int)

    def wrap(self, step: str, function: Callable[..., Any]) -> Callable[..., Any]:
        spent = self.spent

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time_ns()
            try:
                return function(*args, **kwargs)
            finally:
                spent[step] += time.thread_time_ns() - started

        return timed


def extender(nodes: int, policy: str) -> tuple[FakePodApi, ExtenderApi, list[str]]:
    """The e2e bench's extender over ``nodes`` nodes, scoring against the trace's profile."""
    shape = common_shape()
    names = [f"node-{i:05d}" for i in range(nodes)]
    heartbeat = "2026-01-01T00:00:00Z"
    cache = ClusterCache(ResourceNames(), policy=policy)
    cache.replace_nodes([node_manifest(node_spec(name, shape), heartbeat) for name in names])
    cache.replace_pods([])
    profile = WorkloadProfile.from_pods([p.request for p in load_pods(resolve_trace(TRACE))])
    cache.profile = profile
    cache.scheduler = Scheduler(cache.state, make_policy(cache.policy_name), profile=profile)
    api = FakePodApi()
    api.listeners.append(lambda kind, p: cache.remove_pod(p) if kind == "DELETED" else cache.upsert_pod(p))
    service = ExtenderService(cache, Binder(cache, api))
    freeze_long_lived()  # as the extender does once its ledger is built
    return api, ExtenderApi(service, ResourceNames(), ExtenderMetrics(ledger=cache), requests=cache.requests), names


def instrument(served: ExtenderApi, clock: StepClock) -> None:
    """Wrap each step's function (see the module doc) with ``clock``."""
    service = served.service
    cache: Any = service.cache
    setattr(http_api, "parse_extender_args", clock.wrap("parse", parse_extender_args))  # noqa: B010
    setattr(service_module, "best_nodes", clock.wrap("best", best_nodes))  # noqa: B010
    for target, attribute, step in ((served, "_placed_request", "request"), (served, "_tenant", "request"),
                                    (cache, "drop_lapsed", "lapsed"), (cache, "unassume", "lapsed"),
                                    (cache, "admit", "admit"), (service.node_rows, "rows", "rows"),
                                    (cache.scheduler, "filter_and_score", "core"), (service, "_one_best", "best"),
                                    (cache, "assume", "assume"), (served.records, "name_list", "answer")):
        setattr(target, attribute, clock.wrap(step, getattr(target, attribute)))


def measure(nodes: int, pods: int, seed: int, policy: str) -> dict[str, Any]:
    api, served, names = extender(nodes, policy)
    shape = common_shape()
    drawn = gpu_pods(pods, shape, nodes, seed, TRACE).pods
    clock = StepClock()
    instrument(served, clock)
    rng = random.Random(seed)
    # the names as the request brings them: strings of their own, not the ledger's (whose memory
    # encoding the body here would otherwise have just read, warming it for the lookups)
    wire_names = [name.encode().decode() for name in names]
    per_pod: dict[str, list[float]] = defaultdict(list)
    passed = 0
    loop = asyncio.new_event_loop()
    try:
        for i, pod in enumerate(drawn):
            created = api.create_pod(pod_manifest(pod, f"gpu-{i:05d}", "bench"))
            order = wire_names[:]
            rng.shuffle(order)
            body = orjson.dumps({"Pod": created, "NodeNames": order})
            clock.spent.clear()
            started = time.thread_time_ns()
            decoded = orjson.loads(body)
            clock.spent["decode"] += time.thread_time_ns() - started
            answer, _ = loop.run_until_complete(served._filter(decoded))
            total = time.thread_time_ns() - started
            sent = orjson.loads(answer.data)["NodeNames"] if isinstance(answer, http_api.RawJson) \
                else answer["NodeNames"]
            for step in STEPS:
                per_pod[step].append(clock.spent[step] / 1e6)
            per_pod["other"].append((total - sum(clock.spent.values())) / 1e6)
            per_pod["total"].append(total / 1e6)
            if sent:
                passed += 1
                meta = created["metadata"]
                served.service.bind(meta["namespace"], meta["name"], meta["uid"], sent[0])
    finally:
        loop.close()
    skip = len(drawn) // 10
    return {"nodes": nodes, "pods": len(drawn), "passed": passed, "policy": policy, "seed": seed,
            "load_average_1m": round(os.getloadavg()[0], 2),
            "ms_per_filter": {step: round(statistics.median(values[skip:]), 3) for step, values in per_pod.items()},
            "mean_ms_per_filter": {step: round(statistics.fmean(values[skip:]), 3) for step, values in per_pod.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=600)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--policy", default="gpupool", help="the extender's --policy")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    opts = parser.parse_args()
    result = measure(opts.nodes, opts.pods, opts.seed, opts.policy)
    means = result["mean_ms_per_filter"]
    print(f"{'step':<8} {'median':>8} {'mean':>8}  (ms per filter)")
    for step, ms in result["ms_per_filter"].items():
        print(f"{step:<8} {ms:8.3f} {means[step]:8.3f}")
    if opts.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
