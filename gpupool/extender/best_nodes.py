"""Filter down to the policy's best nodes: the answer of ``--filter-best-only``.

Why: with the scheduler configuration that has no ``prioritizeVerb`` (docs/extender.md, "Filter
best only"), kube-scheduler makes one call per pod instead of two, does not decode a 0..10 score for
every node, and runs its own score plugins on the few nodes that can win instead of all of them. The
placement stays the policy's: the nodes passed are exactly those prioritize would score
:data:`MAX_EXTENDER_PRIORITY` (ties included), and the shipped weight makes kube-scheduler choose
among exactly those (docs/fidelity.md); its plugins break the ties in both modes.

Every feasible node that is not among the best still gets a reason from the service; the HTTP
answer sends the reasons only when no node passed, the one case kube-scheduler reads them
(:meth:`gpupool.extender.http.api.ExtenderApi._reasons_needed`). Such a node is *not* a preemption
candidate in practice: kube-scheduler v1.20 runs PostFilter (default preemption) only when no node
passed the filter, and a best node exists whenever some node fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.fragmentation import FloatArray
from gpupool.core.state import IntArray
from gpupool.extender.node_scores import MAX_EXTENDER_PRIORITY, scale_scores

NOT_BEST = "fits, but the policy prefers other nodes (score {score} < best 10)"
"""The reason of a feasible node that is not among the best; ``score`` on prioritize's 0..10 scale."""
_NOT_BEST_REASONS = tuple(NOT_BEST.format(score=s) for s in range(MAX_EXTENDER_PRIORITY))
"""One string per step: the reasons are shared, not formatted per node (1,000s per call)."""


@dataclass(frozen=True)
class BestNodes:
    """The best of the feasible nodes (their order kept), their rows and scores, and why each other
    feasible node was left out."""

    passed: list[str]
    rows: IntArray
    scores: FloatArray
    not_best: dict[str, str]


def best_nodes(passed: list[str], rows: IntArray, scores: FloatArray, *, reasons: bool = True) -> BestNodes:
    """Keep the feasible nodes ``passed`` (rows and policy scores aligned with it) whose score is the
    highest; the others get :data:`NOT_BEST` with their step on prioritize's scale (none without
    ``reasons``: an answer that has a node drops them anyway)."""
    if not passed:
        return BestNodes([], rows, scores, {})
    steps = scale_scores(passed, scores, passed).scores  # prioritize's own 0..10 of the same nodes
    best = steps == MAX_EXTENDER_PRIORITY
    if best.all():
        return BestNodes(passed, rows, scores, {})
    keep = np.flatnonzero(best).tolist()
    if not reasons:
        return BestNodes([passed[i] for i in keep], rows[best], scores[best], {})
    drop = np.flatnonzero(~best).tolist()
    step_of = steps.tolist()
    return BestNodes([passed[i] for i in keep], rows[best], scores[best],
                     {passed[i]: _NOT_BEST_REASONS[step_of[i]] for i in drop})
