"""Fragmentation Gradient Descent (Weng et al., ATC'23), as published.

Each pod goes where it increases the cluster's fragmentation (measured against the workload's
typical pods, see :mod:`gpupool.core.fragmentation`) the least. The node score is the paper
simulator's ``int(100 * sigmoid((frag_before - frag_after) / 1000))``: the truncation to integers is
part of the published behaviour (it creates ties, broken by the scheduler's node order), so it is
kept here to reproduce the paper; gpupool's own policy drops it.
"""

from __future__ import annotations

import numpy as np

from gpupool.core.cards import NodeScratch, SharedCardChooser
from gpupool.core.fragmentation import DEFAULT_CPU_MILLI, FloatArray, FragmentationMeasure, WorkloadProfile
from gpupool.core.model import GpuRequest
from gpupool.core.policies.base import PlacementPolicy, PodShape
from gpupool.core.policies.card_memo import CardScoreMemo
from gpupool.core.state import BoolArray, ClusterState, IntArray


class FragmentationPolicy(PlacementPolicy):
    """Shared machinery: per-card fragmentation deltas for a pod over candidate nodes."""

    scores_from_ledger_rows = True
    scores_dearly = True

    def prepare(self, state: ClusterState, profile: WorkloadProfile | None) -> None:
        super().prepare(state, profile)
        self.measure = FragmentationMeasure(state, profile or WorkloadProfile(()))
        self.card_memo = CardScoreMemo()

    def card_gains(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        """``[R, G]`` fragmentation decrease (before - after) per candidate card; -inf where unfit.

        For whole-card, multi-card and CPU-only pods the card does not matter to the measure, so
        every column holds the node's value.
        """
        return self.fragment_gains(shape, rows, fits, None)

    def fragment_gains(self, shape: PodShape, rows: IntArray, fits: BoolArray,
                       free: IntArray | None) -> FloatArray:
        """:meth:`card_gains`, reusing the rows' free compute per card when the caller has it."""
        if shape.shares_one_card:
            before, after = self.measure.before_and_after_slice(rows, shape.milli, shape.cpu_milli, free)
            gains = before[:, None] - after
            return np.where(fits, gains, -np.inf)
        measure = self.measure
        if free is None:
            free = measure.card_free(rows)
        if shape.gpu is None:
            before, after_node = measure.before_and_after_taking(rows, None, 0, shape.cpu_milli, free)
        elif shape.gpu.exclusive:
            taken = measure.whole_cards_taken(rows, shape.count, free)
            before, after_node = measure.before_and_after_taking(rows, taken, None, shape.cpu_milli, free)
        else:
            order = np.argsort(np.where(fits, free, np.iinfo(np.int64).max), axis=1, kind="stable")
            taken = np.zeros_like(fits)
            np.put_along_axis(taken, order[:, : shape.count], True, axis=1)
            before, after_node = measure.before_and_after_taking(rows, taken & fits, shape.milli,
                                                                 shape.cpu_milli, free)
        gains = np.repeat((before - after_node)[:, None], fits.shape[1], axis=1)
        return gains

    def card_scores(self, gains: FloatArray) -> FloatArray:
        """Turn fragmentation gains into the policy's scores (same shape)."""
        raise NotImplementedError

    def card_tiebreak(self, scratch: NodeScratch) -> FloatArray:
        """A small per-card term added when choosing a slice's card within one node (default none)."""
        return np.zeros(len(scratch.compute_free))

    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> FloatArray:
        """A node scores as its best card; pods without GPUs score by the node-wide gain."""
        scores = self.card_scores(self.card_gains(state, shape, rows, fits))
        if shape.shares_one_card:
            assert shape.gpu is not None
            self.card_memo.store(state, (shape.cpu_milli, shape.gpu), rows, scores, fits)
        if shape.gpu is None:
            return scores[:, 0] if scores.shape[1] else self.card_scores(np.zeros(len(rows)))
        result: FloatArray = np.maximum.reduce(np.where(fits, scores, -1.0), axis=1)
        return result

    def share_scores(self, state: ClusterState, shape: PodShape, source: IntArray, target: IntArray) -> None:
        if shape.shares_one_card:  # the per-card scores the chooser reads (see node_score)
            assert shape.gpu is not None
            self.card_memo.copy_rows(state, (shape.cpu_milli, shape.gpu), source, target)

    def shared_chooser(self) -> SharedCardChooser:
        def choose(state: ClusterState, scratch: NodeScratch, request: GpuRequest, mask: BoolArray,
                   cpu_milli: int) -> int:
            shape = PodShape(cpu_milli=cpu_milli or DEFAULT_CPU_MILLI, memory_mib=0, gpu=request)
            scores = self.card_memo.lookup(state, (shape.cpu_milli, request), scratch.row, mask)
            if scores is None:  # not scored at this version (or not with these cards): score it now
                rows = np.array([scratch.row], dtype=np.int64)
                scores = self.card_scores(self.card_gains(state, shape, rows, mask[None, :])[0])
            return int(np.argmax(np.where(mask, scores + self.card_tiebreak(scratch), -np.inf)))

        return choose


EXPONENT_CAP = 700.0
"""Largest exponent the sigmoid scores evaluate: ``exp`` of more overflows (above 709.78), and a
score of ``100 / (1 + exp(700))`` truncates to 0 as the overflow's would. Capping costs less than
silencing the overflow warning with ``np.errstate`` on every score."""


def sigmoid_score(gain: FloatArray) -> FloatArray:
    """The paper simulator's integer score: ``int(100 / (1 + exp(-gain / 1000)))``."""
    result: FloatArray = np.trunc(100.0 / (1.0 + np.exp(np.minimum(-gain / 1000.0, EXPONENT_CAP))))
    return result


class FgdPolicy(FragmentationPolicy):
    """FGD exactly as the paper's simulator scores it."""

    name = "fgd"

    def card_scores(self, gains: FloatArray) -> FloatArray:
        return sigmoid_score(gains)
