"""The objects of bench/e2e_scheduling.py: nodes as their node agent and kubelet would show them,
and pods drawn from the bundled trace (pure; no API calls).

Nodes: ``count`` copies of the bundled openb cluster's most common 8-card machine (its CPU, memory
and card model), each with the ``inventory-v1`` annotation and the extended resources the node
agent advertises, and a Ready condition. No kubelet stands behind them: kube-scheduler only reads
the Node objects, and nothing in this cluster evicts or taints (no controller-manager).

Pods: the GPU pods are the seed's packing arrivals (:func:`gpupool.sim.packing.workload`, as
bench/fidelity.py draws them), the trace's CPU-only pods left out; the CPU-only pods are drawn with
the same seed from the trace's CPU-only pods. Pods larger than half a node (CPU, memory or cards;
about 1 % of the GPU pods: the 8-card ones and those asking for more than 48 cores) are skipped:
kube-scheduler's own scores spread the pods over the nodes, so such a pod can find no node with
enough left, stay Pending and keep the run from ending; :class:`Drawn` says how many.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench.fidelity_scenario import pod_object
from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuCard, NodeSpec, PodRequest
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.sim.packing import workload
from gpupool.sim.trace import load_nodes, load_pods, resolve_nodes, resolve_trace

NAMES = ResourceNames()
CARDS_PER_NODE = 8
NODE_PODS = 1000
"""Pods per node in allocatable: never the limit (the trace's pods count only CPU, memory and GPUs)."""
MEMORY_UNIT_MIB = 256
"""One ``gpu-mem`` device of the node agent (gpupool/nodeagent/types.py)."""
CORE_PER_CARD = 100
"""``gpu-core`` devices per card: 1 % each."""


@dataclass(frozen=True)
class NodeShape:
    """One machine of the bundled cluster: allocatable CPU (milli), memory (MiB), card model and memory."""

    cpu_milli: int
    memory_mib: int
    model: str
    card_mib: int


@dataclass(frozen=True)
class Drawn:
    """Pods drawn from the trace, and how many were passed over because no node could hold them."""

    pods: tuple[PodRequest, ...]
    skipped_too_large: int


def common_shape(cards: int = CARDS_PER_NODE) -> NodeShape:
    """The most common shape among the bundled cluster's machines with ``cards`` cards."""
    shapes = Counter((n.cpu_milli, n.memory_mib, n.cards[0].model, n.cards[0].memory_mib)
                     for n in load_nodes(resolve_nodes("openb")) if len(n.cards) == cards)
    if not shapes:
        raise ValueError(f"the bundled cluster has no machine with {cards} cards")
    cpu, memory, model, card_mib = shapes.most_common(1)[0][0]
    return NodeShape(cpu, memory, model, card_mib)


def node_spec(name: str, shape: NodeShape, cards: int = CARDS_PER_NODE) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=shape.cpu_milli, memory_mib=shape.memory_mib,
                    cards=tuple(GpuCard(i, f"GPU-{name}-{i}", shape.model, shape.card_mib) for i in range(cards)),
                    labels={"gpupool.io/gpu-model": shape.model})


def node_manifest(spec: NodeSpec, heartbeat: str) -> dict[str, Any]:
    """The Node as the API shows it once kubelet registered it and the node agent published its cards."""
    cards = len(spec.cards)
    card_mib = spec.cards[0].memory_mib if cards else 0
    resources = {
        "cpu": f"{spec.cpu_milli}m", "memory": f"{spec.memory_mib}Mi", "pods": str(NODE_PODS),
        NAMES.gpu: str(cards),
        NAMES.gpu_mem: str(cards * (card_mib // MEMORY_UNIT_MIB)),
        NAMES.gpu_core: str(cards * CORE_PER_CARD),
        NAMES.gpu_shared: str(cards * (card_mib // MEMORY_UNIT_MIB + CORE_PER_CARD)),
    }
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench node",
             "lastHeartbeatTime": heartbeat, "lastTransitionTime": heartbeat}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": spec.name, "labels": dict(spec.labels),
                         "annotations": {NAMES.inventory: encode_inventory(Inventory(spec.cards, spec.topology))}},
            "status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}}


LARGEST_SHARE = 0.5
"""The largest pod drawn, as a share of one node's CPU, memory and cards (see the module doc)."""


def fits_half_node(pod: PodRequest, shape: NodeShape, cards: int = CARDS_PER_NODE) -> bool:
    gpus = sum(c.gpu.count for c in pod.containers if c.gpu is not None)
    return (pod.cpu_milli <= LARGEST_SHARE * shape.cpu_milli and pod.memory_mib <= LARGEST_SHARE * shape.memory_mib
            and gpus <= LARGEST_SHARE * cards)


def gpu_pods(count: int, shape: NodeShape, nodes: int, seed: int, trace: str = "default") -> Drawn:
    """The first ``count`` GPU pods of the seed's arrivals (clones when the trace has fewer)."""
    every = [p.request for p in load_pods(resolve_trace(trace))]
    capacity = nodes * CARDS_PER_NODE * COMPUTE_PER_CARD
    picked: list[PodRequest] = []
    skipped = 0
    rounds = 0
    while len(picked) < count:  # a larger cluster than the trace: draw again with the next seed
        for pod in workload(every, seed + rounds, capacity):
            if not pod.wants_gpu:
                continue
            if not fits_half_node(pod, shape):
                skipped += 1
                continue
            picked.append(pod)
            if len(picked) == count:
                break
        rounds += 1
        if not picked:
            raise ValueError(f"trace {trace!r} has no GPU pod that fits half a node")
    return Drawn(tuple(picked), skipped)


def cpu_pods(count: int, shape: NodeShape, seed: int, trace: str = "default") -> Drawn:
    """``count`` of the trace's CPU-only pods, drawn with replacement with ``seed``."""
    pool = [p.request for p in load_pods(resolve_trace(trace)) if not p.request.wants_gpu]
    fitting = [p for p in pool if fits_half_node(p, shape)]
    if not fitting:
        raise ValueError(f"trace {trace!r} has no CPU-only pod that fits half a node")
    rng = random.Random(seed)
    return Drawn(tuple(rng.choice(fitting) for _ in range(count)), len(pool) - len(fitting))


def pod_manifest(pod: PodRequest, name: str, namespace: str) -> dict[str, Any]:
    """The trace pod as a Kubernetes pod (bench/fidelity_scenario.py's translation) under ``name``."""
    manifest = pod_object(pod)
    manifest["metadata"] = {**manifest["metadata"], "name": name, "namespace": namespace}
    manifest["spec"]["terminationGracePeriodSeconds"] = 0
    return {"apiVersion": "v1", "kind": "Pod", **manifest}


def demand(pods: tuple[PodRequest, ...]) -> tuple[int, int, int]:
    """CPU milli, memory MiB and GPU per-mille the pods request in all."""
    return (sum(p.cpu_milli for p in pods), sum(p.memory_mib for p in pods),
            sum(p.gpu_milli_total() for p in pods))
