"""The one interface every placement policy implements.

Like kube-scheduler's score plugins, a policy is a small object that scores candidate nodes for a
pod from the cluster state; it never books anything. Scores are "higher is better" floats over the
rows it is given. Policies whose score of a node depends only on that node (``node_local``) let the
scheduler cache scores per request shape and recompute only nodes that changed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, final

import numpy as np

from gpupool.core.cards import SharedCardChooser
from gpupool.core.fragmentation import DEFAULT_CPU_MILLI, FloatArray, WorkloadProfile, primary_gpu
from gpupool.core.model import GpuRequest, PodRequest
from gpupool.core.policies.topology import topology_rise
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.core.units import COMPUTE_PER_CARD


@dataclass(frozen=True)
class PodShape:
    """What scoring looks at: the pod's CPU (non-zero), memory, and its main GPU request."""

    cpu_milli: int
    memory_mib: int
    gpu: GpuRequest | None

    @staticmethod
    def of(pod: PodRequest) -> PodShape:
        return PodShape(cpu_milli=pod.cpu_milli or DEFAULT_CPU_MILLI, memory_mib=pod.memory_mib,
                        gpu=primary_gpu(pod))

    @property
    def milli(self) -> int:
        """Per-card compute in per-mille (whole cards count 1000), 0 without GPUs."""
        if self.gpu is None:
            return 0
        return COMPUTE_PER_CARD if self.gpu.exclusive else self.gpu.compute

    @property
    def count(self) -> int:
        return 0 if self.gpu is None else self.gpu.count

    @property
    def shares_one_card(self) -> bool:
        return self.gpu is not None and not self.gpu.exclusive and self.gpu.count == 1


class PlacementPolicy(ABC):
    """Scores nodes for a pod; optionally chooses the card for a sub-card slice."""

    name: ClassVar[str]
    node_local: ClassVar[bool] = True
    scores_from_ledger_rows: ClassVar[bool] = False
    """Whether a node's score is a function of its ledger row alone (:mod:`gpupool.core.row_groups`
    lists what that is): then nodes with equal rows are scored once for all. Set only where the
    policy's code was checked to read nothing else of a node (not its placements, names or labels)."""
    scores_dearly: ClassVar[bool] = False
    """Whether scoring a node costs more than numbering its state for the grouping (the fragmentation
    policies: every card against every workload class). Binpack-like scores cost less than that, and
    grouping their nodes measured no faster (docs/performance.md)."""
    scores_pod_memory: ClassVar[bool] = False
    """Whether a node's score reads the pod's memory request (:attr:`PodShape.memory_mib`): the
    scheduler keeps scores per CPU and GPU request, and adds the memory to that key only for such a
    policy (kube-scheduler's LeastAllocated, replayed by ``dra-allocator``), which otherwise scored a
    pod with the scores of another that differed in memory alone."""

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self.rng = rng or np.random.default_rng(0)
        self.profile: WorkloadProfile | None = None

    def prepare(self, state: ClusterState, profile: WorkloadProfile | None) -> None:
        """Called once the cluster and the expected workload are known (FGD needs the latter)."""
        self.profile = profile

    @final
    def score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        """Scores of ``rows`` (all feasible) for a pod of ``shape``; ``fits`` is the ``[R, G]`` mask of
        cards that can hold one slice of its GPU request (all False without one).

        The policy's :meth:`node_score`, raised for a multi-card pod by how well each node can connect
        its cards (:mod:`gpupool.core.policies.topology`): every policy honours the topology the same
        way, and only between nodes it scores equal.
        """
        scores = self.node_score(state, shape, rows, fits)
        if shape.count < 2:
            return scores
        result: FloatArray = scores + topology_rise(state, shape.count, rows, fits)
        return result

    @abstractmethod
    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        """The policy's own scores of ``rows`` (see :meth:`score`); integers for every policy but random,
        so that the topology term, below one step, orders only nodes scored equal."""

    def scores_are_node_local(self) -> bool:
        """Whether :meth:`score` of a node depends on that node alone (the scheduler may cache it)."""
        return self.node_local

    def scores_read_ledger_rows(self) -> bool:
        """:attr:`scores_from_ledger_rows` of the policy that scores (a per-pod policy's node policy)."""
        return self.scores_from_ledger_rows

    def scores_cost_dearly(self) -> bool:
        """:attr:`scores_dearly` of the policy that scores (a per-pod policy's node policy)."""
        return self.scores_dearly

    def scores_read_pod_memory(self) -> bool:
        """:attr:`scores_pod_memory` of the policy that scores (a per-pod policy's node policy)."""
        return self.scores_pod_memory

    def share_scores(self, state: ClusterState, shape: PodShape, source: IntArray, target: IntArray) -> None:
        """Rows ``target`` have the ledger rows of ``source`` (pairwise) and ``source`` was just scored
        for ``shape``: give ``target`` whatever the policy kept of that scoring (default: nothing)."""
        return None

    def normalize(self, scores: FloatArray) -> FloatArray:
        """Turn raw scores of the feasible nodes into final ones (identity unless overridden)."""
        return scores

    def shared_chooser(self) -> SharedCardChooser | None:
        """The card chooser for sub-card slices; None means best fit."""
        return None


def gpu_free(state: ClusterState, rows: IntArray) -> IntArray:
    """Free compute per card of ``rows`` (missing/unhealthy cards: 0)."""
    usable = state.card_exists[rows] & state.card_healthy[rows]
    return np.where(usable, state.card_compute_free[rows], 0)


def tightest_fit_card(free: IntArray, fits: BoolArray) -> IntArray:
    """Per row, the fitting card with the least free compute (ties: lowest index); -1 if none."""
    masked = np.where(fits, free, np.iinfo(np.int64).max)
    best = masked.argmin(axis=1)
    return np.where(fits.any(axis=1), best, -1)

