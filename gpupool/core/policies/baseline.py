"""The published baseline policies, as the FGD paper's simulator scores them.

Random, DotProd, Clustering, Packing and BestFit follow the formulas of the paper's simulator (so
that ``bench/packing.py`` can be compared with its reference table); binpack and spread are Alibaba
gpushare's two modes. All use best fit for the card of a sub-card slice except random.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from gpupool.core.cards import NodeScratch, SharedCardChooser
from gpupool.core.fragmentation import FloatArray
from gpupool.core.model import GpuRequest, Placement
from gpupool.core.policies.base import PlacementPolicy, PodShape, gpu_free
from gpupool.core.state import BoolArray, ClusterState, IntArray

MAX_SPEC_CPU = 128_000
"""CPU of the largest machine type the paper's formulas normalise by (milli-cores)."""
MAX_SPEC_GPU = 8_000
"""GPU of the largest machine type the paper's formulas normalise by (milli-GPU)."""


class RandomPolicy(PlacementPolicy):
    """A uniformly random feasible node, and a random card that fits."""

    name = "random"
    node_local = False

    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        return self.rng.random(len(rows))

    def shared_chooser(self) -> SharedCardChooser:
        def choose(state: ClusterState, scratch: NodeScratch, request: GpuRequest, mask: BoolArray,
                   cpu_milli: int) -> int:
            return int(self.rng.choice(np.flatnonzero(mask)))

        return choose


class BinpackPolicy(PlacementPolicy):
    """Alibaba gpushare's binpack: the node whose best card is the tightest fit.

    Slices: the node holding the card with the least free memory that still fits. Whole cards: the
    node with the fewest idle cards left (fill started nodes first).
    """

    name = "binpack"
    scores_from_ledger_rows = True

    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        if shape.gpu is None:
            return np.asarray(-state.cpu_free[rows], dtype=np.float64)
        if shape.gpu.exclusive:
            return np.asarray(-fits.sum(axis=1), dtype=np.float64)
        mem = np.where(fits, state.card_mem_free[rows], np.iinfo(np.int64).max)
        return np.asarray(-mem.min(axis=1), dtype=np.float64)

    def shared_chooser(self) -> SharedCardChooser:
        def choose(state: ClusterState, scratch: NodeScratch, request: GpuRequest, mask: BoolArray,
                   cpu_milli: int) -> int:
            candidates = np.flatnonzero(mask)
            order = np.lexsort((candidates, scratch.compute_free[candidates], scratch.mem_free[candidates]))
            return int(candidates[order[0]])

        return choose


class SpreadPolicy(PlacementPolicy):
    """Alibaba gpushare's spread: the node with the most free GPU, and its emptiest card."""

    name = "spread"
    scores_from_ledger_rows = True

    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        return np.asarray(gpu_free(state, rows).sum(axis=1) + state.cpu_free[rows] / 1e9, dtype=np.float64)

    def shared_chooser(self) -> SharedCardChooser:
        def choose(state: ClusterState, scratch: NodeScratch, request: GpuRequest, mask: BoolArray,
                   cpu_milli: int) -> int:
            candidates = np.flatnonzero(mask)
            return int(candidates[np.argmax(scratch.compute_free[candidates])])

        return choose


class BestFitPolicy(PlacementPolicy):
    """The paper's BestFit: least leftover of CPU and GPU (each normalised), min-max scaled."""

    name = "bestfit"
    scores_from_ledger_rows = True

    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        left_cpu = state.cpu_free[rows] - shape.cpu_milli
        left_gpu = gpu_free(state, rows).sum(axis=1) - shape.milli * shape.count
        s = 0.5 * left_cpu / MAX_SPEC_CPU + 0.5 * left_gpu / MAX_SPEC_GPU
        return np.asarray(np.trunc((1.0 - s) * 100.0), dtype=np.float64)

    def normalize(self, scores: FloatArray) -> FloatArray:
        """Min-max onto 0..100 (rounded down) of the integer part; the topology rise (the fraction,
        see :meth:`PlacementPolicy.score`) is kept on top, so it still orders equal nodes."""
        if len(scores) == 0:
            return scores
        whole = np.floor(scores)
        rise = scores - whole
        low, high = whole.min(), whole.max()
        if high == low:
            return np.asarray(rise, dtype=np.float64)
        return np.asarray(np.floor((whole - low) * 100.0 / (high - low)) + rise, dtype=np.float64)


class DotProductPolicy(PlacementPolicy):
    """The paper's DotProd: the smallest dot product of free (CPU, GPU) and the request."""

    name = "dotprod"
    scores_from_ledger_rows = True

    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        node_cpu = state.cpu_free[rows] / MAX_SPEC_CPU
        node_gpu = gpu_free(state, rows).sum(axis=1) / MAX_SPEC_GPU
        dot = node_cpu * (shape.cpu_milli / MAX_SPEC_CPU) + node_gpu * (shape.milli * shape.count / MAX_SPEC_GPU)
        return np.asarray(np.trunc(100.0 * (1.0 - dot / 2.0)), dtype=np.float64)


class PackingPolicy(PlacementPolicy):
    """The paper's Packing: prefer partly used cards, then partly used nodes, then idle nodes."""

    name = "packing"
    scores_from_ledger_rows = True

    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        if shape.milli <= 0:
            return np.zeros(len(rows))
        free = gpu_free(state, rows)
        exists = state.card_exists[rows]
        idle = ((free == 1000) & exists).sum(axis=1)
        cards = exists.sum(axis=1)
        scores = np.zeros(len(rows))
        for i in range(len(rows)):
            if idle[i] == cards[i]:
                scores[i] = max(33 - idle[i], idle[i])
                continue
            order = np.argsort(np.where(exists[i], free[i], 10**9), kind="stable")
            taken = [g for g in order if exists[i, g] and free[i, g] >= shape.milli][: shape.count]
            used_idle = sum(1 for g in taken if free[i, g] == 1000)
            if used_idle > 0:
                scores[i] = max(50 - used_idle, 33)
            else:
                remaining = sum(int(free[i, g]) * 100 // 1000 for g in taken)
                scores[i] = max(100 - remaining // 10, 50)
        return scores


def affinity_tag(placement: Placement) -> str | None:
    """The paper's Clustering tag: "share-gpu", "<k>-gpu" for k whole cards, None without GPUs."""
    slices = [s for c in placement.containers if not c.init for s in c.slices]
    if not slices:
        return None
    exclusive = sum(1 for s in slices if s.exclusive)
    return f"{exclusive}-gpu" if exclusive else "share-gpu"


class ClusteringPolicy(PlacementPolicy):
    """The paper's Clustering: put pods with the same GPU shape together."""

    name = "clustering"

    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        if shape.gpu is None:
            return np.zeros(len(rows))
        tag = "share-gpu" if not shape.gpu.exclusive else f"{shape.count}-gpu"
        used = MAX_SPEC_GPU - gpu_free(state, rows).sum(axis=1)
        base = 25 * used // MAX_SPEC_GPU
        scores = np.zeros(len(rows))
        for i, row in enumerate(rows):
            tags = Counter(
                t for key in state.pods_on.get(int(row), ())
                if (t := affinity_tag(state.placements[key])) is not None
            )
            if tags.get(tag, 0) > 0:
                bonus = 75 if len(tags) == 1 else 50
            else:
                bonus = 25 if not tags else 0
            scores[i] = base[i] + bonus
        return scores

