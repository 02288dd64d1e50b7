"""Does the cluster decide what the simulator decides? One trace replayed through both.

The same scaled-down packing experiment (``--nodes`` nodes sampled from the bundled openb cluster
with ``--seed``, the seed's arrivals of :func:`gpupool.sim.packing.workload` up to ``--upto`` % of
the sample's GPU capacity) is replayed twice:

* **simulator**: :class:`gpupool.core.scheduler.Scheduler` books each pod, as ``gpupool simulate``
  does (node order for equal scores: the seed's permutation, :func:`gpupool.sim.packing.tie_order`);
* **extender**: every trace pod becomes a Kubernetes pod in the in-process :class:`FakePodApi`, and
  a stand-in for kube-scheduler v1.20 with only the extender scoring schedules it: its
  NodeResourcesFit filter (CPU and memory requested by the pods bound on each node), then the
  extender's HTTP ``/filter``, ``/prioritize`` and ``/bind`` (aiohttp app of
  :class:`gpupool.extender.http.api.ExtenderApi`, binder writing to the fake API, the API's pod
  events fed to the extender's cache). The node is the best-scored one; kube-scheduler breaks
  ties uniformly at random (``selectHost``'s reservoir sampling), and this stand-in takes the first
  tied node in the simulator's tie order: one particular random draw, the one the simulator made.

Pods without GPUs never reach the extender in a cluster (``managedResources``: kube-scheduler asks
it only about pods that request a gpupool resource); kube-scheduler's own plugins place them. This
bench binds them itself, through the fake API, on the node the simulator's policy picks from the
pods actually bound (the "bound" ledger below), so both replays place them by the same rule and a
difference in them can only come from an earlier GPU pod's difference.

The *bound* ledger is the truth of the extender replay: every pod the API shows bound, with the
cards of its assignment and its CPU and memory. At the end it is compared with the extender's own
ledger: ``ledger_mismatch_nodes`` counts nodes whose free CPU, memory or card space differ.

    python3 bench/fidelity.py --nodes 150 --seed 42 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from aiohttp.test_utils import TestClient, TestServer

from gpupool.api.annotations import Inventory, decode_assignment, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import NodeSpec, Placement, PodRequest
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState, IntArray
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService
from gpupool.sim.packing import policy_rng, tie_order, workload
from gpupool.sim.trace import load_nodes, load_pods, resolve_nodes, resolve_trace
from gpupool.testing.fake_api import FakePodApi

NAMESPACE = "default"
NAMES = ResourceNames()
NODE_PODS = "1000"
"""Pods per node in the fake nodes' allocatable: high enough never to be the limit (the trace has none)."""


@dataclass(frozen=True)
class Outcome:
    """Where one pod ended: the node and, per app container, its card indices; node None if nowhere."""

    node: str | None
    cards: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @staticmethod
    def of(placement: Placement) -> Outcome:
        return Outcome(placement.node, tuple((a.container, a.cards) for a in placement.containers if not a.init))


UNPLACED = Outcome(None)


@dataclass(frozen=True)
class Replay:
    """One replay's outcome per pod key and its unallocated GPU share (% of capacity) at the end."""

    outcomes: dict[str, Outcome]
    unallocated_pct: float
    seconds: float
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scenario:
    """The sampled cluster, the arrivals and the workload profile both replays score against."""

    nodes: tuple[NodeSpec, ...]
    arrivals: tuple[PodRequest, ...]
    profile: WorkloadProfile
    policy: str
    seed: int

    @property
    def capacity(self) -> int:
        return sum(card.compute for node in self.nodes for card in node.cards)

    def ties(self) -> IntArray:
        return tie_order(self.seed, len(self.nodes))


def build_scenario(trace: str, node_count: int, seed: int, upto_pct: int, policy: str) -> Scenario:
    """``node_count`` nodes drawn with ``seed`` (kept in list order) and the seed's arrivals, cut where
    the arrived GPU demand would pass ``upto_pct`` % of the sample's capacity."""
    every = load_nodes(resolve_nodes("openb"))
    picked = np.sort(np.random.default_rng(seed).choice(len(every), size=min(node_count, len(every)),
                                                        replace=False))
    nodes = tuple(every[int(i)] for i in picked)
    pods = [p.request for p in load_pods(resolve_trace(trace))]
    capacity = sum(card.compute for node in nodes for card in node.cards)
    arrivals: list[PodRequest] = []
    arrived = 0
    for pod in workload(pods, seed, capacity):
        arrived += pod.gpu_milli_total()
        if arrived * 100 > upto_pct * capacity:
            break
        arrivals.append(pod)
    return Scenario(nodes, tuple(arrivals), WorkloadProfile.from_pods(pods), policy, seed)


def unallocated_pct(state: ClusterState, capacity: int) -> float:
    return round(100.0 * (capacity - state.allocated_compute()) / capacity, 4)


# ------------------------------------------------------------------------------------ simulator
def replay_simulator(scenario: Scenario) -> Replay:
    """The packing experiment's loop (:func:`gpupool.sim.packing.run_seed`), keeping every placement."""
    started = time.perf_counter()
    state = ClusterState(scenario.nodes)
    rng = policy_rng(scenario.seed)
    scheduler = Scheduler(state, make_policy(scenario.policy, rng), profile=scenario.profile,
                          tie_rank=scenario.ties(), rng=rng)
    outcomes: dict[str, Outcome] = {}
    for pod in scenario.arrivals:
        decision = scheduler.schedule(pod)
        outcomes[pod.key] = Outcome.of(decision) if isinstance(decision, Placement) else UNPLACED
    return Replay(outcomes, unallocated_pct(state, scenario.capacity), time.perf_counter() - started)


# ------------------------------------------------------------------------------- Kubernetes objects
def node_object(spec: NodeSpec) -> dict[str, Any]:
    """The node as the API shows it once its node agent published the inventory."""
    allocatable = {"cpu": f"{spec.cpu_milli}m", "memory": f"{spec.memory_mib}Mi", "pods": NODE_PODS}
    inventory = encode_inventory(Inventory(spec.cards, spec.topology))
    return {"metadata": {"name": spec.name, "labels": dict(spec.labels),
                         "annotations": {NAMES.inventory: inventory}},
            "status": {"capacity": allocatable, "allocatable": allocatable}}


def pod_object(pod: PodRequest) -> dict[str, Any]:
    """A trace pod as a Kubernetes pod: CPU and memory requests, its GPU as gpupool resources.

    A slice of the trace is ``gpu-core`` alone (per cent of a card, memory in proportion, as the
    trace means it); whole cards are ``gpu``; model restrictions the ``gpu-models`` annotation.
    """
    containers: list[dict[str, Any]] = []
    annotations: dict[str, str] = {}
    for container in pod.containers:
        limits: dict[str, str] = {}
        gpu = container.gpu
        if gpu is not None:
            if gpu.exclusive:
                limits[NAMES.gpu] = str(gpu.count)
            else:
                limits[NAMES.gpu_core] = str(gpu.compute * 100 // COMPUTE_PER_CARD)
                if gpu.count > 1:
                    limits[NAMES.gpu_shared] = str(gpu.count)
            if gpu.models:
                annotations[NAMES.gpu_models] = ",".join(sorted(gpu.models))
        requests = {"cpu": f"{container.cpu_milli}m", "memory": f"{container.memory_mib}Mi"}
        containers.append({"name": container.name, "image": "trace",
                           "resources": {"requests": requests, "limits": limits}})
    return {"metadata": {"name": pod.key, "namespace": NAMESPACE, "annotations": annotations},
            "spec": {"containers": containers}}


# ------------------------------------------------------------------------------------- extender
class KubeSchedulerStandIn:
    """kube-scheduler v1.20 around the extender, for one replay (see the module doc)."""

    def __init__(self, scenario: Scenario, client: TestClient[Any, Any], api: FakePodApi) -> None:
        self.scenario = scenario
        self.client = client
        self.api = api
        self.bound = ClusterState(scenario.nodes)
        self.bound_scheduler = Scheduler(self.bound, make_policy(scenario.policy, policy_rng(scenario.seed)),
                                         profile=scenario.profile, tie_rank=scenario.ties(),
                                         rng=policy_rng(scenario.seed))
        order = np.argsort(scenario.ties(), kind="stable")
        self.node_order = [scenario.nodes[int(i)].name for i in order]
        self.rank = {name: position for position, name in enumerate(self.node_order)}
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
        scores = await self.post("prioritize", {"Pod": created, "NodeNames": passed})
        best = max(entry["Score"] for entry in scores)
        tied: list[str] = [entry["Host"] for entry in scores if entry["Score"] == best]
        return min(tied, key=self.rank.__getitem__)

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
        return Outcome.of(placement)


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


async def _replay_extender(scenario: Scenario) -> Replay:
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
    service = ExtenderService(cache, Binder(cache, api))
    app = ExtenderApi(service, NAMES, ExtenderMetrics()).app()
    async with TestClient(TestServer(app)) as client:
        kube = KubeSchedulerStandIn(scenario, client, api)
        outcomes = {pod.key: await kube.schedule(pod) for pod in scenario.arrivals}
    mismatched = ledger_mismatches(kube.bound, cache.state)
    notes = [*kube.notes, f"ledger_mismatch_nodes={len(mismatched)}"]
    return Replay(outcomes, unallocated_pct(kube.bound, scenario.capacity), time.perf_counter() - started,
                  tuple(notes))


def replay_extender(scenario: Scenario) -> Replay:
    return asyncio.run(_replay_extender(scenario))


# --------------------------------------------------------------------------------------- report
def compare(scenario: Scenario, simulator: Replay, extender: Replay) -> dict[str, Any]:
    keys = [pod.key for pod in scenario.arrivals]
    gpu_keys = [pod.key for pod in scenario.arrivals if pod.wants_gpu]
    same = [k for k in keys if simulator.outcomes[k] == extender.outcomes[k]]
    same_gpu = [k for k in gpu_keys if simulator.outcomes[k] == extender.outcomes[k]]
    first = next((k for k in keys if simulator.outcomes[k] != extender.outcomes[k]), None)
    mismatch_note = next((n for n in extender.notes if n.startswith("ledger_mismatch_nodes=")), "=0")
    return {
        "nodes": len(scenario.nodes), "pods": len(keys), "gpu_pods": len(gpu_keys),
        "seed": scenario.seed, "policy": scenario.policy,
        "same_placement_pct": round(100.0 * len(same) / max(len(keys), 1), 2),
        "same_placement_gpu_pct": round(100.0 * len(same_gpu) / max(len(gpu_keys), 1), 2),
        "unallocated_pct_extender": extender.unallocated_pct,
        "unallocated_pct_simulator": simulator.unallocated_pct,
        "first_divergence": None if first is None else {
            "pod": first, "position": keys.index(first),
            "simulator": _describe(simulator.outcomes[first]), "extender": _describe(extender.outcomes[first])},
        "bind_refusals": sum(1 for n in extender.notes if "bind to" in n),
        "ledger_mismatch_nodes": int(mismatch_note.split("=")[1]),
        "seconds_extender": round(extender.seconds, 2), "seconds_simulator": round(simulator.seconds, 2),
    }


def _describe(outcome: Outcome) -> str:
    if outcome.node is None:
        return "unplaced"
    cards = "; ".join(f"{name}: {list(cards)}" for name, cards in outcome.cards)
    return f"{outcome.node} {cards}".strip()


def table(result: dict[str, Any]) -> str:
    rows = [("nodes / pods (with GPU)", f"{result['nodes']} / {result['pods']} ({result['gpu_pods']})"),
            ("same placement, all pods", f"{result['same_placement_pct']:.2f} %"),
            ("same placement, GPU pods", f"{result['same_placement_gpu_pct']:.2f} %"),
            ("unallocated GPU, extender", f"{result['unallocated_pct_extender']:.2f} %"),
            ("unallocated GPU, simulator", f"{result['unallocated_pct_simulator']:.2f} %"),
            ("binds refused", str(result["bind_refusals"])),
            ("nodes where the ledgers differ", str(result["ledger_mismatch_nodes"])),
            ("first divergence", json.dumps(result["first_divergence"]))]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=150)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trace", default="default")
    parser.add_argument("--policy", default="gpupool")
    parser.add_argument("--upto", type=int, default=100, help="arrived GPU demand, % of capacity")
    parser.add_argument("--json", action="store_true", help="print one JSON line after the table")
    args = parser.parse_args(argv)
    scenario = build_scenario(args.trace, args.nodes, args.seed, args.upto, args.policy)
    simulator = replay_simulator(scenario)
    extender = replay_extender(scenario)
    result = compare(scenario, simulator, extender)
    print(table(result))
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
