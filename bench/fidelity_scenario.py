"""The scenario of bench/fidelity.py and its simulator replay, and the trace as Kubernetes objects.

A scenario is one seed of the packing experiment on a sample of the bundled cluster; both replays
(:func:`replay_simulator` here, the extender's in :mod:`fidelity_kube`) read the same one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import NodeSpec, Placement, PodRequest
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState, IntArray
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.sim.packing import policy_rng, tie_order, workload
from gpupool.sim.trace import load_nodes, load_pods, resolve_nodes, resolve_trace

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
