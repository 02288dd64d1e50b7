"""kube-scheduler's DRA path as a placement policy, to measure what its card choice costs.

A pod that asks for a gpupool share through a ResourceClaim is placed by kube-scheduler alone: the
extender is not asked (the pod names no gpupool extended resource), so the node is chosen by the
default profile's score plugins and the card by the DRA allocator (docs/dra.md, "Choosing between
the extender path and the DRA path"). This policy replays that choice on the simulator's ledger,
read from kube-scheduler v1.37's source:

* **Node**: ``NodeResourcesFit`` with its default ``LeastAllocated`` strategy (CPU and memory,
  weight 1 each: ``(allocatable - requested) * 100 / allocatable`` per resource, the pod's requests
  included, integer arithmetic) plus ``NodeResourcesBalancedAllocation`` (v1.37: the balance of the
  CPU and memory fractions with the pod against without it,
  ``50 + (50 + with - without) / 2`` where each side is ``(1 - |f_cpu - f_mem| / 2) * 100``),
  both weight 1. ``DynamicResources`` scores only prioritized-list alternatives (none here), the
  other default plugins (taints, affinity, spread, image locality) see nothing in a trace. GPUs
  count in no score: the allocator does not score devices.
* **Card**: the allocator takes the first device, in the ResourceSlice's order (the node agent
  publishes cards by index), whose remaining consumable memory and compute fit the request: first
  fit by card index, where gpupool takes the best fit. Whole cards are chosen as gpupool chooses
  them (on cards without links, the lowest free index: the allocator's first fit too).

Left out: kube-scheduler scores only a sample of the feasible nodes on large clusters
(``percentageOfNodesToScore``, adaptive by default; here every feasible node is scored, as
gpupool's own scheduler configuration sets 100) and breaks ties at random (here by node order).
"""

from __future__ import annotations

import numpy as np

from gpupool.core.cards import NodeScratch, SharedCardChooser
from gpupool.core.fragmentation import FloatArray
from gpupool.core.model import GpuRequest
from gpupool.core.policies.base import PlacementPolicy, PodShape
from gpupool.core.policies.gpupool_policy import GpupoolPolicy
from gpupool.core.state import BoolArray, ClusterState, IntArray

MAX_NODE_SCORE = 100
"""kube-scheduler's framework.MaxNodeScore."""


def least_allocated(requested: IntArray, allocatable: IntArray) -> IntArray:
    """``leastRequestedScore`` per node (0 where the request exceeds the capacity or there is none)."""
    safe = np.maximum(allocatable, 1)
    score = (allocatable - requested) * MAX_NODE_SCORE // safe
    return np.where((allocatable > 0) & (requested <= allocatable), score, 0)


def balance(cpu_used: IntArray, cpu_total: IntArray, mem_used: IntArray, mem_total: IntArray) -> FloatArray:
    """``balancedResourceScore`` for CPU and memory: ``(1 - |f_cpu - f_mem| / 2) * 100``, each
    fraction capped at 1 (a node without one of the two counts as perfectly balanced)."""
    f_cpu = np.minimum(cpu_used / np.maximum(cpu_total, 1), 1.0)
    f_mem = np.minimum(mem_used / np.maximum(mem_total, 1), 1.0)
    std = np.where((cpu_total > 0) & (mem_total > 0), np.abs(f_cpu - f_mem) / 2, 0.0)
    return np.asarray(np.trunc((1.0 - std) * MAX_NODE_SCORE), dtype=np.float64)


class DraAllocatorPolicy(PlacementPolicy):
    """kube-scheduler's default node scores and the DRA allocator's first-fit card (module doc)."""

    name = "dra-allocator"
    scores_from_ledger_rows = True
    scores_pod_memory = True

    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        cpu_total, mem_total = state.cpu_total[rows], state.mem_total[rows]
        cpu_before, mem_before = cpu_total - state.cpu_free[rows], mem_total - state.mem_free[rows]
        cpu_after, mem_after = cpu_before + shape.cpu_milli, mem_before + shape.memory_mib
        fit = (least_allocated(cpu_after, cpu_total) + least_allocated(mem_after, mem_total)) // 2
        with_pod = balance(cpu_after, cpu_total, mem_after, mem_total)
        without_pod = balance(cpu_before, cpu_total, mem_before, mem_total)
        balanced = np.trunc(MAX_NODE_SCORE / 2 + (MAX_NODE_SCORE / 2 + with_pod - without_pod) / 2)
        return np.asarray(fit + balanced, dtype=np.float64)

    def shared_chooser(self) -> SharedCardChooser:
        return first_fit


def first_fit(state: ClusterState, scratch: NodeScratch, request: GpuRequest, mask: BoolArray, cpu_milli: int) -> int:
    """The DRA allocator's card: the first (by index) whose remaining capacity fits."""
    return int(np.flatnonzero(mask)[0])


class DraSteeredPolicy(GpupoolPolicy):
    """The DRA path with gpupool choosing the node (``scheduler.claimPods``, docs/dra.md): gpupool's
    node scores, which the extender passes as the one best node, and the allocator's first-fit card
    on it. Only the shared card differs from ``gpupool``; whole cards are chosen alike (see above).
    The extender scores the node with gpupool's own card choice in mind; the allocator may then take
    another card there, which this replay follows from then on."""

    name = "dra-steered"

    def shared_chooser(self) -> SharedCardChooser:
        return first_fit
