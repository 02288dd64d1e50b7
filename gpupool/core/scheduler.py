"""One scheduling decision: filter, score, pick the node, choose the cards.

This is the code path the simulator replays and the extender serves, so a decision in a capacity
planning run is the decision the cluster would make. It is pure: it reads and (in
:meth:`Scheduler.schedule`) books into a :class:`ClusterState`, nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gpupool.core.cards import assign_on_node
from gpupool.core.feasibility import (
    card_fit_mask,
    explain_node,
    node_fit_mask,
    node_room_mask,
    request_fit,
    request_problem,
)
from gpupool.core.fragmentation import FloatArray, WorkloadProfile
from gpupool.core.model import Placement, PodRequest
from gpupool.core.pod_policy import PolicyChoice
from gpupool.core.policies import PerPodPolicy, PlacementPolicy, PodShape
from gpupool.core.remote_share import (
    RemoteChoice,
    client_scores,
    place_share,
    remote_shape_problem,
    share_alone,
)
from gpupool.core.row_groups import GROUP_FROM_ROWS, RowGroups
from gpupool.core.shape_cache import RowCache, RowCaches
from gpupool.core.state import BoolArray, ClusterState, IntArray

EXPLAIN_MEMO_REQUESTS = 64
"""Requests (pod shapes) whose failure reasons are remembered; the least recently used goes first."""

GroupRows = Literal["auto", "always", "never"]
"""When the scheduler evaluates nodes in identical states once (see :class:`Scheduler`)."""

PICK_TRIES = 8
"""Best-scored nodes on which the card choice is tried before a pod is declared unschedulable."""


@dataclass(frozen=True)
class Unschedulable:
    """A pod that fits nowhere (or not on the node asked), with the reason."""

    pod_key: str
    reason: str


def _one_gpu_request(pod: PodRequest) -> bool:
    """Exactly one GPU container and no GPU init containers: the pod's one request is its shape's."""
    return len(pod.gpu_containers) == 1 and all(c.gpu is None for c in pod.init_containers)


def _is_simple(pod: PodRequest) -> bool:
    """One GPU container at most and no GPU init containers: the vectorised path is exact."""
    return len(pod.gpu_containers) <= 1 and all(c.gpu is None for c in pod.init_containers)


class Scheduler:
    """Places pods on a :class:`ClusterState` with one placement policy.

    ``tie_rank`` orders nodes for equal scores (lower wins); without it ties are broken at random.
    Feasibility and the scores of node-local policies are cached per request shape
    (:mod:`gpupool.core.shape_cache`) and recomputed only for nodes that changed since, which is
    what makes replaying a 1,000-node trace take seconds. When many rows are recomputed at once (a
    shape not seen before) and the policy scores from ledger rows alone, nodes in identical states
    are evaluated once per state (:mod:`gpupool.core.row_groups`): ``group_rows`` "auto" does it where
    the policy's scores are also dear (:meth:`PlacementPolicy.scores_cost_dearly`), "always" wherever
    it is exact (the tests), "never" not at all.
    """

    def __init__(self, state: ClusterState, policy: PlacementPolicy, *, profile: WorkloadProfile | None = None,
                 tie_rank: IntArray | None = None, rng: np.random.Generator | None = None,
                 cache: bool = True, group_rows: GroupRows = "auto") -> None:
        self.state = state
        self.policy = policy
        self.tie_rank = tie_rank
        self.rng = rng or np.random.default_rng(0)
        self.use_cache = cache and policy.node_local
        self._feasibility: RowCaches[np.bool_] = RowCaches(False, np.bool_)
        """Per (CPU, memory, GPU request, pod policy): can the node hold the pod."""
        self._scores: RowCaches[np.float64] = RowCaches(-np.inf, np.float64)
        """Per (non-zero CPU, GPU request, pod policy): the policy's raw score of the node."""
        self._explained: dict[PodRequest, dict[int, tuple[int, str | None]]] = {}
        self._profile = profile
        self._per_pod: dict[PolicyChoice, PlacementPolicy] = {}
        self._rows_memo: IntArray = np.zeros(0, dtype=np.int64)
        self._groups = RowGroups(state) if group_rows != "never" else None
        self._group_always = group_rows == "always"
        policy.prepare(state, profile)

    def policy_for(self, pod: PodRequest) -> PlacementPolicy:
        """The scheduler's policy, or the pod's own node/card choice on top of it (one per choice)."""
        if pod.policy is None or pod.policy.is_default:
            return self.policy
        found = self._per_pod.get(pod.policy)
        if found is None:
            found = self._per_pod[pod.policy] = PerPodPolicy(self.policy, pod.policy)
            found.prepare(self.state, self._profile)
        return found

    # ------------------------------------------------------------------------- filter and score
    def _evaluate(self, shape: PodShape, pod: PodRequest, rows: IntArray) -> tuple[BoolArray, FloatArray]:
        """Feasible rows among ``rows`` and the raw scores of all (-inf where infeasible)."""
        feasible, fits = self._feasible_in_reach(shape, pod, rows)
        raw = np.full(len(rows), -np.inf)
        if len(fits):  # one row of card masks per feasible row
            raw[feasible] = self.policy_for(pod).score(self.state, shape, rows[feasible], fits)
        return feasible, raw

    def _feasible_in_reach(self, shape: PodShape, pod: PodRequest, rows: IntArray) -> tuple[BoolArray, BoolArray]:
        """:meth:`_feasible`, evaluated only on the rows with a card of the request's scope."""
        scope = shape.gpu.scope if shape.gpu is not None else None
        if scope is not None:
            # a node without a card of the request's scope cannot hold it: only the others are
            # evaluated (a group's pod costs its group's nodes, not the cluster's)
            reach = self.state.scope_reach(scope)[rows]
            if not reach.all():
                feasible = np.zeros(len(rows), dtype=bool)
                if not reach.any():
                    return feasible, np.zeros((0, self.state.max_cards), dtype=bool)
                feasible[reach], fits = self._feasible(shape, pod, rows[reach])
                return feasible, fits
        return self._feasible(shape, pod, rows)

    def _feasible(self, shape: PodShape, pod: PodRequest, rows: IntArray) -> tuple[BoolArray, BoolArray]:
        """Feasible rows among ``rows``, and the card mask of the feasible ones for the shape's request."""
        gpu = shape.gpu
        if gpu is None:
            feasible = node_fit_mask(self.state, pod, rows)
            return feasible, np.zeros((int(feasible.sum()), self.state.max_cards), dtype=bool)
        if _one_gpu_request(pod):
            # the card mask node_fit_mask would compute for the pod's one request: computed once here
            if gpu.virtual is not None:  # count cards, or one card holding them all
                enough, cards = request_fit(self.state, gpu, rows)
                feasible = node_room_mask(self.state, pod, rows) & enough
                return feasible, cards[feasible]
            cards = card_fit_mask(self.state, gpu, rows)
            feasible = node_room_mask(self.state, pod, rows) & (np.add.reduce(cards, axis=1) >= gpu.count)
            return feasible, cards[feasible]
        feasible = node_fit_mask(self.state, pod, rows)
        return feasible, request_fit(self.state, gpu, rows[feasible])[1]

    def _all_rows(self) -> IntArray:
        """``arange(size)``, kept while the cluster keeps its size (read-only)."""
        if len(self._rows_memo) != self.state.size:
            self._rows_memo = np.arange(self.state.size, dtype=np.int64)
            self._rows_memo.flags.writeable = False
        return self._rows_memo

    def filter_and_score(self, pod: PodRequest, rows: IntArray | None = None) -> tuple[IntArray, FloatArray]:
        """Feasible rows among ``rows`` (default: all) and their final scores (higher is better)."""
        state = self.state
        all_rows = self._all_rows()
        if pod.remote:  # the tier of the share decides, not the placement policy
            return client_scores(state, pod, all_rows if rows is None else np.asarray(rows, dtype=np.int64),
                                 self._servers(pod))
        shape = PodShape.of(pod)
        policy = self.policy_for(pod)
        if _is_simple(pod):
            if self.use_cache and policy.scores_are_node_local():
                feasible, raw = self._cached(shape, pod)
            else:
                feasible, raw = self._evaluate(shape, pod, all_rows)
            if rows is not None:
                keep = np.zeros(state.size, dtype=bool)
                keep[rows] = True
                feasible = feasible & keep
            ok: IntArray = feasible.nonzero()[0]
            return ok, policy.normalize(raw.take(ok))
        candidates = all_rows if rows is None else np.asarray(rows, dtype=np.int64)
        prefilter = candidates[node_fit_mask(state, pod, candidates)]
        chooser = policy.shared_chooser()
        ok_list = [int(r) for r in prefilter if isinstance(assign_on_node(state, int(r), pod, chooser), Placement)]
        ok = np.array(ok_list, dtype=np.int64)
        if not len(ok):
            return ok, np.zeros(0)
        _, raw = self._evaluate(shape, PodRequest(key=pod.key, containers=(), policy=pod.policy), ok)
        return ok, policy.normalize(raw)

    def _cached(self, shape: PodShape, pod: PodRequest) -> tuple[BoolArray, FloatArray]:
        """Every row's feasibility and raw score (current for the feasible rows), from the shape
        caches: only rows whose node changed since are recomputed, and only those whose score no
        pod of the same CPU and GPU request (and memory, for a policy whose scores read it) has
        computed at the node's version are scored."""
        size = self.state.size
        versions = self.state.node_version[:size]
        memory = shape.memory_mib if self.policy_for(pod).scores_read_pod_memory() else 0
        scores = self._scores.entry((shape.cpu_milli, memory, shape.gpu, pod.policy), size)
        feasibility = self._feasibility.entry((pod.cpu_milli, pod.memory_mib, shape.gpu, pod.policy), size)
        if feasibility.bound != scores.generation:  # its feasible rows' scores are not in this entry
            feasibility.version[:] = -1
            feasibility.bound = scores.generation
        stale = feasibility.stale(versions)
        if len(stale) >= GROUP_FROM_ROWS and self._grouped(self.policy_for(pod)):
            self._refresh_grouped(shape, pod, stale, feasibility, scores)
        elif len(stale):
            feasible, fits = self._feasible_in_reach(shape, pod, stale)
            feasibility.values[stale] = feasible
            feasibility.version[stale] = versions.take(stale)
            rows = stale[feasible]
            if len(rows):
                unscored = scores.version.take(rows) != versions.take(rows)
                if not unscored.all():
                    rows, fits = rows[unscored], fits[unscored]
                if len(rows):
                    scores.values[rows] = self.policy_for(pod).score(self.state, shape, rows, fits)
                    scores.version[rows] = versions.take(rows)
        return feasibility.values, scores.values

    def _grouped(self, policy: PlacementPolicy) -> bool:
        """Whether rows are evaluated once per state for ``policy`` (see the class doc)."""
        if self._groups is None or not policy.scores_read_ledger_rows():
            return False
        return self._group_always or policy.scores_cost_dearly()

    def _refresh_grouped(self, shape: PodShape, pod: PodRequest, stale: IntArray, feasibility: RowCache[np.bool_],
                         scores: RowCache[np.float64]) -> None:
        """:meth:`_cached`'s recomputation of ``stale``, with one node evaluated per group of nodes in
        identical states (their feasibility, card masks and scores are equal) and its answers copied."""
        assert self._groups is not None
        state = self.state
        versions = state.node_version[:state.size]
        scope = shape.gpu.scope if shape.gpu is not None else None
        first, member_of = self._groups.group(stale, state.scope_mask(scope) if scope is not None else None)
        heads = stale.take(first)
        head_feasible, head_fits = self._feasible_in_reach(shape, pod, heads)
        feasible = head_feasible.take(member_of)
        feasibility.values[stale] = feasible
        feasibility.version[stale] = versions.take(stale)
        rows = stale[feasible]
        if not len(rows):
            return
        unscored = scores.version.take(rows) != versions.take(rows)
        rows = rows[unscored]
        if not len(rows):
            return
        needed, back = np.unique(member_of[feasible][unscored], return_inverse=True)
        back = back.reshape(-1)
        fits_at = np.cumsum(head_feasible) - 1  # a feasible head's row in head_fits
        policy = self.policy_for(pod)
        scored = heads.take(needed)
        scores.values[rows] = policy.score(state, shape, scored, head_fits.take(fits_at.take(needed), 0)).take(back)
        scores.version[rows] = versions.take(rows)
        policy.share_scores(state, shape, scored.take(back), rows)

    # ----------------------------------------------------------------------------------- decide
    def pick(self, rows: IntArray, scores: FloatArray) -> IntArray:
        """Rows ordered best first: by score, then tie rank (or random order when none is set)."""
        return self._order(rows, scores, self._secondary(rows))

    def _secondary(self, rows: IntArray) -> IntArray:
        """The tie order of ``rows`` (a draw from the generator when no tie rank is set)."""
        if self.tie_rank is not None:
            return self.tie_rank.take(rows)
        secondary: IntArray = self.rng.permutation(len(rows))
        return secondary

    @staticmethod
    def _order(rows: IntArray, scores: FloatArray, secondary: IntArray) -> IntArray:
        order = np.lexsort((secondary, -scores))
        return rows[order]

    @staticmethod
    def _first(rows: IntArray, scores: FloatArray, secondary: IntArray) -> int | None:
        """``_order(...)[0]`` without sorting every row (the first pick almost always holds the pod);
        None when a NaN score makes the shortcut unsafe."""
        top = np.maximum.reduce(scores)
        if np.isnan(top):
            return None
        tied = (scores == top).nonzero()[0]
        return int(rows[tied[secondary.take(tied).argmin()]])

    def decide(self, pod: PodRequest) -> Placement | Unschedulable:
        """The placement the policy chooses for ``pod`` (nothing is booked)."""
        problem = request_problem(self.state, pod)
        if problem is not None:
            return Unschedulable(pod.key, problem)
        rows, scores = self.filter_and_score(pod)
        if not len(rows):
            return Unschedulable(pod.key, "no node can hold the pod")
        if pod.remote:
            for row in self.pick(rows, scores)[:PICK_TRIES]:
                remote = self._remote(pod, int(row))
                if isinstance(remote, Placement):
                    return remote
            return Unschedulable(pod.key, "no node can hold the pod")
        chooser = self.policy_for(pod).shared_chooser()
        secondary = self._secondary(rows)
        first = self._first(rows, scores, secondary)
        if first is not None:
            result = assign_on_node(self.state, first, pod, chooser)
            if isinstance(result, Placement):
                return result
        best = self._order(rows, scores, secondary)
        for row in best[:PICK_TRIES]:
            if int(row) == first:
                continue
            result = assign_on_node(self.state, int(row), pod, chooser)
            if isinstance(result, Placement):
                return result
        return Unschedulable(pod.key, "no node can hold the pod")

    def schedule(self, pod: PodRequest) -> Placement | Unschedulable:
        """Decide and book."""
        decision = self.decide(pod)
        if isinstance(decision, Placement):
            self.state.apply(decision)
        return decision

    def assign(self, pod: PodRequest, node: str) -> Placement | Unschedulable:
        """Choose cards for ``pod`` on a node someone else chose (the extender's bind); nothing booked."""
        row = self.state.index.get(node)
        if row is None or not self.state.present[row]:
            return Unschedulable(pod.key, f"node {node} is not known to gpupool")
        problem = request_problem(self.state, pod)
        if problem is not None:
            return Unschedulable(pod.key, problem)
        if pod.remote:
            remote = self._remote(pod, row)
            return remote if isinstance(remote, Placement) else Unschedulable(pod.key, remote)
        result = assign_on_node(self.state, row, pod, self.policy_for(pod).shared_chooser())
        if isinstance(result, Placement):
            return result
        return Unschedulable(pod.key, result)

    def _remote(self, pod: PodRequest, row: int) -> Placement | str:
        """A remote-share pod run on node ``row``: its share's placement (on ``row`` itself, or on
        the server node chosen by :func:`gpupool.core.remote_share.place_share`), or why not."""
        choice = place_share(self.state, pod, row, self.policy_for(pod).shared_chooser(), self._servers(pod))
        return choice.placement if isinstance(choice, RemoteChoice) else choice

    def _servers(self, pod: PodRequest) -> IntArray | None:
        """The nodes that could hold the share of a remote-share pod (its slice alone), from the
        shape caches like any pod's feasible nodes; None for a pod that cannot be remote."""
        if remote_shape_problem(pod) is not None:
            return None
        return self.filter_and_score(share_alone(pod))[0]

    def explain(self, pod: PodRequest, rows: IntArray) -> dict[str, str]:
        """Reasons, per node name, why the pod does not fit on each of ``rows``.

        A reason depends only on the node's bookings and description and on the pod's request (not
        its name), so it is remembered per request and node and reused while the node's
        :attr:`ClusterState.node_version` is unchanged: kube-scheduler asks about the same failing
        nodes for every pod of a kind, and explaining one walks its cards in Python.
        """
        if pod.remote:  # a node's reason depends on every GPU node's cards: not kept per node version
            return self._explain_remote(pod, rows)
        request = dataclasses.replace(pod, key="")
        memo = self._explained.pop(request, {})
        self._explained[request] = memo  # most recently used last
        if len(self._explained) > EXPLAIN_MEMO_REQUESTS:
            self._explained.pop(next(iter(self._explained)))
        versions = self.state.node_version
        reasons: dict[str, str] = {}
        for row in rows.tolist():
            known = memo.get(row)
            if known is not None and known[0] == versions[row]:
                reason = known[1]
            else:
                reason = self._explain_row(pod, row)
                memo[row] = (int(versions[row]), reason)
            if reason is not None:
                reasons[self.state.specs[row].name] = reason
        return reasons

    def _explain_remote(self, pod: PodRequest, rows: IntArray) -> dict[str, str]:
        """:meth:`explain` of a remote-share pod: the servers are worked out once for all ``rows``."""
        servers = self._servers(pod)
        chooser = self.policy_for(pod).shared_chooser()
        reasons: dict[str, str] = {}
        for row in rows.tolist():
            choice = place_share(self.state, pod, row, chooser, servers)
            if not isinstance(choice, RemoteChoice):
                reasons[self.state.specs[row].name] = choice
        return reasons

    def _explain_row(self, pod: PodRequest, row: int) -> str | None:
        reason = explain_node(self.state, row, pod)
        if reason is None:
            result = assign_on_node(self.state, row, pod, self.policy_for(pod).shared_chooser())
            reason = None if isinstance(result, Placement) else result
        return reason
