"""How the extender ranks the nodes that fit a pod for kube-scheduler: prioritize's 0..10 scores,
the best of them that the filter passes (``--filter-best-only``), and the one of those it passes
alone (``--filter-one-best``, the default).

One rule read three ways, hence one module: the filter passes exactly the nodes prioritize would
score :data:`MAX_EXTENDER_PRIORITY` (ties included), and of those the first in a fixed node order.

**Prioritize's scale** (:func:`scale_scores`, :class:`NodeScores`): the policy's scores of the
feasible nodes mapped onto kube-scheduler's integers 0..10, so that exactly the best nodes get 10.
The answer's type is shared by the service and the HTTP adapter, which writes it straight to JSON.

**The best nodes** (:func:`best_nodes`). Why: with the scheduler configuration that has no
``prioritizeVerb`` (docs/extender.md, "Filter best only"), kube-scheduler makes one call per pod
instead of two, does not decode a 0..10 score for every node, and runs its own score plugins on the
few nodes that can win instead of all of them. The placement stays the policy's: the shipped weight
makes kube-scheduler choose among exactly the nodes passed (docs/fidelity.md); its plugins break
the ties in both modes. Every feasible node that is not among the best still gets a reason from the
service; the HTTP answer sends the reasons only when no node passed, the one case kube-scheduler
reads them (:meth:`gpupool.extender.http.api.ExtenderApi._reasons_needed`). Such a node is *not* a
preemption candidate in practice: kube-scheduler v1.20 runs PostFilter (default preemption) only
when no node passed the filter, and a best node exists whenever some node fits.

**The one best node** (:class:`TieRanks`, :func:`has_soft_preferences`). Why: the best nodes are
often many exact ties (every empty node, every node whose fullest card the pod would fill alike: a
median of 994 of 1,000 in ``bench/e2e_scheduling.py``). Passed them all, kube-scheduler runs its
score plugins on each and draws among its own favourites (LeastAllocated prefers the emptiest: the
opposite of packing). Passed one, kube-scheduler v1.20 takes it without scoring
(``genericScheduler.Schedule`` returns at once for a single feasible node), and the pod lands where
the simulator, breaking ties by the same kind of fixed node order, would put it. The order is a hash
of the node's name: the same for every call, every replica and every restart, and unrelated to
names' alphabetical order. A pod with soft preferences (preferred node or pod affinity or
anti-affinity, topology spread constraints that only prefer) still gets every best node, so that
kube-scheduler's plugins honour those preferences among them.

kube-scheduler filters the next pod while the last one's bind is still on its way. The node passed
alone is not skipped for the next pod: the filter books its pod's cards there at once (``ASSUMED``,
:mod:`gpupool.extender.bookings`), so the next filter sees the node as fuller and passes it again
only where it holds the next pod too (a packing policy often prefers it then, as the simulator,
placing pods one after the other, would): kube-scheduler's own plugins likewise see the pods it has
assumed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpupool.core.fragmentation import FloatArray
from gpupool.core.state import ClusterState, IntArray

# ------------------------------------------------------------------------- prioritize's 0..10

MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler's MaxExtenderPriority: extender scores are integers 0..10."""


@dataclass(frozen=True)
class NodeScores:
    """Prioritize's answer: ``scores[i]`` (0..10) for ``hosts[i]``, in the order asked.

    Why two aligned sequences and not a dict: the answer has an entry per node on every call, and
    zipping them into a dict only to walk it again to write JSON would double prioritize's time
    (docs/extender.md, "Numbers behind the code"). The HTTP adapter writes the JSON straight from
    the array.

    ``rows``: when set, the ledger row of every host (``rows[i]`` is ``hosts[i]`` in the layout
    numbered ``layout``), so an adapter can write the answer from per-row records it keeps.
    """

    hosts: list[str]
    scores: IntArray
    rows: IntArray | None = None
    layout: int | None = None

    @staticmethod
    def uniform(hosts: list[str], score: int = 0) -> NodeScores:
        return NodeScores(hosts, np.full(len(hosts), score, dtype=np.int64))

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self.hosts, self.scores.tolist(), strict=True))


def scale_scores(passed: list[str], scores: FloatArray, names: list[str]) -> NodeScores:
    """Map the policy's scores of feasible nodes onto 0..10 (min-max, rounded down); other nodes get 0.

    Exactly the nodes with the best score get 10 and every other node at most 9, so kube-scheduler,
    which takes a node of the highest total, chooses among the very nodes the simulator chooses
    among (rounding to nearest gave 10 to near-best nodes too: 99 and 100 on a 0..100 scale).
    """
    if not passed:
        return NodeScores.uniform(names)
    low, high = float(scores.min()), float(scores.max())
    if high == low:
        scaled = np.full(len(passed), MAX_EXTENDER_PRIORITY, dtype=np.int64)
    else:
        below_best = MAX_EXTENDER_PRIORITY - 1
        spread = np.floor((scores - low) * MAX_EXTENDER_PRIORITY / (high - low)).astype(np.int64)
        scaled = np.where(scores == high, MAX_EXTENDER_PRIORITY, np.minimum(spread, below_best))
    if len(passed) == len(names):  # the usual prioritize: every node asked about passed (in order)
        return NodeScores(names, scaled)
    position = {name: i for i, name in enumerate(names)}
    full = np.zeros(len(names), dtype=np.int64)
    full[[position[name] for name in passed]] = scaled
    return NodeScores(names, full)


# -------------------------------------------------------------------- the best nodes

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


# ---------------------------------------------------------------- the one best node

RANK_BYTES = 7
"""Bytes of the name's digest in a rank: fits an int64 with room, ties between names ~never."""
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
TIED_NOT_FIRST = "fits as well as the node passed, which comes first in gpupool's node order"
"""The reason of a best node that was not passed (sent only when no node passed, i.e. never)."""


def stable_rank(name: str) -> int:
    """The tie rank of a node: lower wins."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=RANK_BYTES).digest(), "big")


class TieRanks:
    """Each ledger row's rank, rebuilt only when the ledger's layout changes."""

    def __init__(self, rank_of: Callable[[str], int] = stable_rank) -> None:
        self._rank_of = rank_of
        self._by_name: dict[str, int] = {}
        self._rows: tuple[ClusterState, int, IntArray] | None = None

    def ranks(self, state: ClusterState) -> IntArray:
        """Rank per row of ``state`` (indexable by any row the state has)."""
        cached = self._rows
        if cached is not None and cached[0] is state and cached[1] == state.layout_version:
            return cached[2]
        by_name = self._by_name
        for spec in state.specs:
            if spec.name not in by_name:
                by_name[spec.name] = self._rank_of(spec.name)
        ranks = np.fromiter((by_name[spec.name] for spec in state.specs), dtype=np.int64, count=len(state.specs))
        self._rows = (state, state.layout_version, ranks)
        return ranks

    def first(self, state: ClusterState, rows: IntArray) -> int:
        """The position in ``rows`` of the row ranked first."""
        return int(self.ranks(state).take(rows).argmin())


def has_soft_preferences(pod: Mapping[str, Any] | None) -> bool:
    """Whether kube-scheduler's score plugins would weigh a preference of ``pod`` (the object
    kube-scheduler sent): preferred node affinity, preferred pod affinity or anti-affinity, or a
    topology spread constraint with ``whenUnsatisfiable: ScheduleAnyway``. Malformed parts count as
    no preference (kube-scheduler's validation would have refused them)."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        return False
    affinity = spec.get("affinity")
    if isinstance(affinity, Mapping):
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
            rules = affinity.get(kind)
            if isinstance(rules, Mapping) and rules.get(PREFERRED):
                return True
    spread = spec.get("topologySpreadConstraints")
    return isinstance(spread, list) and any(
        isinstance(c, Mapping) and c.get("whenUnsatisfiable") == "ScheduleAnyway" for c in spread)
