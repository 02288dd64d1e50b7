"""kube-scheduler v1.37 around the extender, in process, for bench/fidelity.py (see its doc).

The stand-in filters CPU and memory as NodeResourcesFit does, asks the extender's HTTP verbs
(filter and prioritize, or filter alone with ``--filter-best-only``), optionally adds the default
profile's resource score plugins, takes the best node (ties: the first in the simulator's tie order)
and binds through the extender; pods without GPUs it binds itself. With ``--filter-one-best`` the
extender itself passes one best node, the first in the same tie order.

The resource score plugins are those of kube-scheduler v1.37's default profile, read from its source
(pkg/scheduler/apis/config/v1/default_plugins.go and defaults.go, and
pkg/scheduler/framework/plugins/noderesources/ fit.go, least_allocated.go, balanced_allocation.go,
resource_allocation.go), both weight 1:

* ``NodeResourcesFit``, strategy ``LeastAllocated`` on CPU and memory (weight 1 each): per resource
  ``(allocatable - requested) * 100 // allocatable`` (0 past the capacity), averaged with integer
  division; requested is the node's plus the pod's, each container that asks for no CPU or memory
  counted as 100m and 200 MiB (app containers only: kube-scheduler also counts an init container
  larger than their sum; the trace's pods have none).
* ``NodeResourcesBalancedAllocation`` on CPU and memory: the node's balance with the pod against
  without it, ``50 + (50 + with - without) / 2`` (integer division), each side
  ``int((1 - |f_cpu - f_mem| / 2) * 100)`` with each fraction requested / allocatable capped at 1.
  It counts the actual requests (no defaults) and skips a pod that requests neither (score 0).

Not modelled, because they give every node of the bench's cluster the same score, so they do not
change the choice: ``TaintToleration`` (weight 3; no taints), ``NodeAffinity`` (2; no preferred
affinity), ``PodTopologySpread`` (2; no constraints, and the default ones need a Service or
controller selecting the pod), ``InterPodAffinity`` (2; none), ``ImageLocality`` (1; nodes report
no images) and ``DynamicResources`` (2 where the DynamicResourceAllocation gate is on; no claims).
Also not modelled: kube-scheduler breaks ties at random (here the simulator's tie order) and scores
only a sample of the feasible nodes on clusters of 100 nodes or more (``percentageOfNodesToScore``;
the bench's clusters are smaller or configure 100 %); filtering other than CPU and memory
(ports, volumes, taints) has nothing to refuse here.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import numpy as np
from aiohttp.test_utils import TestClient, TestServer

from bench.fidelity_scenario import (
    NAMES,
    NAMESPACE,
    UNPLACED,
    Outcome,
    Replay,
    Scenario,
    node_object,
    pod_object,
    unallocated_pct,
)
from gpupool.api.annotations import decode_assignment
from gpupool.core.model import Placement, PodRequest
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService, ExtenderSettings
from gpupool.sim.packing import policy_rng
from gpupool.testing.fake_api import FakePodApi

MAX_NODE_SCORE = 100
"""kube-scheduler's framework.MaxNodeScore; an extender's 0..10 is multiplied by 10 to reach it."""
DEFAULT_CPU_REQUEST_MILLI = 100
DEFAULT_MEMORY_REQUEST_MIB = 200
"""What kube-scheduler's score plugins count for a container that requests no CPU or memory."""


class KubeSchedulerStandIn:
    """kube-scheduler v1.37 around the extender, for one replay (see the module doc)."""

    def __init__(self, scenario: Scenario, client: TestClient[Any, Any], api: FakePodApi,
                 extender_weight: int | None = None, best_only: bool = False) -> None:
        self.scenario = scenario
        self.extender_weight = extender_weight
        self.best_only = best_only
        self.nonzero_requested = {spec.name: (0, 0) for spec in scenario.nodes}
        self.requested = {spec.name: (0, 0) for spec in scenario.nodes}
        self.client = client
        self.api = api
        self.bound = ClusterState(scenario.nodes)
        self.bound_scheduler = Scheduler(self.bound, make_policy(scenario.policy, policy_rng(scenario.seed)),
                                         profile=scenario.profile, tie_rank=scenario.ties(),
                                         rng=policy_rng(scenario.seed))
        self.rank = tie_ranks(scenario)
        self.node_order = sorted(self.rank, key=self.rank.__getitem__)
        self.notes: list[str] = []

    async def post(self, verb: str, body: dict[str, Any]) -> Any:
        response = await self.client.post(f"/{verb}", data=json.dumps(body))
        if response.status != 200:
            raise RuntimeError(f"/{verb} answered {response.status}: {await response.text()}")
        return await response.json()

    def resources_fit(self, pod: PodRequest) -> list[str]:
        """NodeResourcesFit: nodes whose unrequested CPU and memory hold the pod, in node order."""
        state = self.bound
        ok = state.present & (state.cpu_free >= pod.cpu_milli) & (state.mem_free >= pod.memory_mib)
        return [name for name in self.node_order if ok[state.index[name]]]

    async def schedule(self, pod: PodRequest) -> Outcome:
        created = self.api.create_pod(pod_object(pod))
        uid = created["metadata"]["uid"]
        node = await (self.extender_node(created, pod) if pod.wants_gpu else self.own_node(pod))
        if node is None:
            self.api.delete_pod(NAMESPACE, pod.key)  # the packing experiment skips a pod that fits nowhere
            return UNPLACED
        if pod.wants_gpu:
            answer = await self.post("bind", {"PodName": pod.key, "PodNamespace": NAMESPACE, "PodUID": uid,
                                              "Node": node})
            if answer.get("Error"):
                self.notes.append(f"{pod.key}: bind to {node} refused: {answer['Error']}")
                self.api.delete_pod(NAMESPACE, pod.key)
                return UNPLACED
        else:
            self.api.bind_pod(NAMESPACE, pod.key, uid, node)
        return self.record_bound(pod, node)

    async def extender_node(self, created: dict[str, Any], pod: PodRequest) -> str | None:
        names = self.resources_fit(pod)
        if not names:
            return None
        passed: list[str] = (await self.post("filter", {"Pod": created, "NodeNames": names}))["NodeNames"] or []
        if len(passed) <= 1:  # kube-scheduler does not score a single feasible node
            return passed[0] if passed else None
        if self.best_only:  # no prioritizeVerb: kube-scheduler's own plugins alone score what passed
            scores: dict[str, int] = dict.fromkeys(passed, 0)
        else:
            answer = await self.post("prioritize", {"Pod": created, "NodeNames": passed})
            scores = {entry["Host"]: entry["Score"] for entry in answer}
        if self.extender_weight is not None:
            scores = {name: self.resource_scores(pod, name) + score * self.extender_weight * MAX_NODE_SCORE // 10
                      for name, score in scores.items()}
        best = max(scores.values())
        tied = [name for name, score in scores.items() if score == best]
        return min(tied, key=self.rank.__getitem__)

    def resource_scores(self, pod: PodRequest, name: str) -> int:
        """NodeResourcesFit (LeastAllocated) + NodeResourcesBalancedAllocation of v1.37, weight 1 each."""
        spec = self.bound.specs[self.bound.index[name]]
        capacity = (spec.cpu_milli, spec.memory_mib)
        cpu, memory = self.nonzero_requested[name]
        pod_cpu, pod_memory = nonzero_request(pod)
        least = least_allocated_score((cpu + pod_cpu, memory + pod_memory), capacity)
        balanced = balanced_allocation_score(self.requested[name], (pod.cpu_milli, pod.memory_mib), capacity)
        return least + balanced

    async def own_node(self, pod: PodRequest) -> str | None:
        decision = self.bound_scheduler.decide(pod)
        return decision.node if isinstance(decision, Placement) else None

    def record_bound(self, pod: PodRequest, node: str) -> Outcome:
        """Book what the API now shows for the pod (its assignment's cards, its CPU and memory)."""
        shown = self.api.get_pod(NAMESPACE, pod.key)
        spec = self.bound.specs[self.bound.index[node]]
        text = (shown["metadata"].get("annotations") or {}).get(NAMES.assignment)
        if text is None:
            placement = Placement(pod.key, node, pod.cpu_milli, pod.memory_mib)
        else:
            placement = decode_assignment(text).to_placement(pod.key, spec, pod.cpu_milli, pod.memory_mib)
        self.bound.apply(placement)
        self.record_bound_requests(pod, node)
        return Outcome.of(placement)

    def record_bound_requests(self, pod: PodRequest, node: str) -> None:
        """Add the pod's CPU and memory to the node's sums the score plugins read: non-zero requests
        (NodeResourcesFit) and actual ones (NodeResourcesBalancedAllocation)."""
        cpu, memory = self.nonzero_requested[node]
        pod_cpu, pod_memory = nonzero_request(pod)
        self.nonzero_requested[node] = (cpu + pod_cpu, memory + pod_memory)
        cpu, memory = self.requested[node]
        self.requested[node] = (cpu + pod.cpu_milli, memory + pod.memory_mib)


def tie_ranks(scenario: Scenario) -> dict[str, int]:
    """Each node's position in the simulator's order for equal scores (lower first)."""
    order = np.argsort(scenario.ties(), kind="stable")
    return {scenario.nodes[int(i)].name: position for position, i in enumerate(order)}


def nonzero_request(pod: PodRequest) -> tuple[int, int]:
    """CPU milli and memory MiB as kube-scheduler's score plugins count them (a default for zero)."""
    cpu = sum(c.cpu_milli or DEFAULT_CPU_REQUEST_MILLI for c in pod.containers)
    memory = sum(c.memory_mib or DEFAULT_MEMORY_REQUEST_MIB for c in pod.containers)
    return cpu, memory


def least_allocated_score(requested: tuple[int, ...], allocatable: tuple[int, ...]) -> int:
    """NodeResourcesFit's LeastAllocated score: the mean, weight 1 each, of
    ``(allocatable - requested) * 100 // allocatable`` over the resources the node has (0 for one
    requested past its capacity); ``requested`` already holds the pod."""
    total = counted = 0
    for used, capacity in zip(requested, allocatable, strict=True):
        if capacity == 0:
            continue
        total += (capacity - used) * MAX_NODE_SCORE // capacity if used <= capacity else 0
        counted += 1
    return total // counted if counted else 0


def balance_score(requested: tuple[int, ...], allocatable: tuple[int, ...]) -> int:
    """``balancedResourceScore``: ``int((1 - std) * 100)`` of the fractions requested/allocatable
    (each capped at 1, resources the node lacks left out); for two the std is ``|f1 - f2| / 2``."""
    fractions = [min(used / capacity, 1.0) for used, capacity in zip(requested, allocatable, strict=True)
                 if capacity != 0]
    std = 0.0
    if len(fractions) == 2:
        std = abs((fractions[0] - fractions[1]) / 2)
    elif len(fractions) > 2:
        mean = sum(fractions) / len(fractions)
        std = math.sqrt(sum((f - mean) * (f - mean) for f in fractions) / len(fractions))
    return int((1 - std) * MAX_NODE_SCORE)


def balanced_allocation_score(allocated: tuple[int, ...], pod: tuple[int, ...], allocatable: tuple[int, ...]) -> int:
    """NodeResourcesBalancedAllocation of v1.37: how much the pod improves the node's balance,
    ``50 + (50 + with - without) / 2`` in integers. ``allocated`` and
    ``pod`` are actual requests (no defaults); a pod that requests nothing is skipped (0)."""
    if not any(pod):
        return 0
    with_pod = balance_score(tuple(a + p for a, p in zip(allocated, pod, strict=True)), allocatable)
    without_pod = balance_score(allocated, allocatable)
    half = MAX_NODE_SCORE // 2
    return half + (half + with_pod - without_pod) // 2  # never negative (each side is 50..100): Go's / too


def ledger_mismatches(bound: ClusterState, ledger: ClusterState) -> list[str]:
    """Nodes whose free CPU, memory or per-card memory/compute differ between two ledgers."""
    differing = []
    for row, spec in enumerate(bound.specs):
        other = ledger.index.get(spec.name)
        if other is None:
            differing.append(spec.name)
            continue
        same = (bound.cpu_free[row] == ledger.cpu_free[other] and bound.mem_free[row] == ledger.mem_free[other]
                and np.array_equal(bound.card_mem_free[row], ledger.card_mem_free[other])
                and np.array_equal(bound.card_compute_free[row], ledger.card_compute_free[other]))
        if not same:
            differing.append(spec.name)
    return differing


def install_profile(cache: ClusterCache, scenario: Scenario) -> None:
    """Score against the scenario's workload profile, as the simulator does.

    The extender otherwise profiles the pods it knows (``refresh_profile``), which here would be the
    arrivals so far; the profile is an input of the decision, not part of the path compared here.
    """
    with cache.lock:
        cache.scheduler = Scheduler(cache.state, make_policy(scenario.policy, policy_rng(scenario.seed)),
                                    profile=scenario.profile, rng=policy_rng(scenario.seed))


async def _replay_extender(scenario: Scenario, extender_weight: int | None, best_only: bool,
                           one_best: bool) -> Replay:
    started = time.perf_counter()
    api = FakePodApi()
    cache = ClusterCache(policy=scenario.policy)
    cache.replace_nodes([node_object(spec) for spec in scenario.nodes])
    cache.replace_pods([])
    install_profile(cache, scenario)

    def deliver(kind: str, pod: dict[str, Any]) -> None:  # the watch, without its latency
        if kind == "DELETED":
            cache.remove_pod(pod)
        else:
            cache.upsert_pod(pod)

    api.listeners.append(deliver)
    settings = ExtenderSettings(filter_best_only=best_only, filter_one_best=one_best,
                                tie_rank=tie_ranks(scenario).__getitem__)
    service = ExtenderService(cache, Binder(cache, api), settings=settings)
    app = ExtenderApi(service, NAMES, ExtenderMetrics(ledger=cache), requests=cache.requests).app()
    async with TestClient(TestServer(app)) as client:
        kube = KubeSchedulerStandIn(scenario, client, api, extender_weight, best_only)
        outcomes = {pod.key: await kube.schedule(pod) for pod in scenario.arrivals}
    mismatched = ledger_mismatches(kube.bound, cache.state)
    notes = [*kube.notes, f"ledger_mismatch_nodes={len(mismatched)}"]
    return Replay(outcomes, unallocated_pct(kube.bound, scenario.capacity), time.perf_counter() - started,
                  tuple(notes))


def replay_extender(scenario: Scenario, extender_weight: int | None = None, best_only: bool = False,
                    one_best: bool = False) -> Replay:
    """The replay through the extender; ``extender_weight`` adds kube-scheduler's resource score
    plugins (see the module doc), None leaves the extender the only scorer. ``best_only``: the
    extender's ``--filter-best-only`` and a configuration without ``prioritizeVerb`` (the plugins,
    when added, then score the passed nodes alone: the weight no longer matters). ``one_best``
    (implies ``best_only``): the extender's ``--filter-one-best``, its node order the simulator's
    tie order, so one node passes and the plugins have nothing to choose."""
    return asyncio.run(_replay_extender(scenario, extender_weight, best_only or one_best, one_best))
