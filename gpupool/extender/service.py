"""The extender's decisions: filter, prioritize, bind and preempt over the ledger and the core.

Why a service between HTTP and the core: the HTTP adapter only speaks the wire format and Kubernetes
JSON, the core only speaks :class:`PodRequest`/:class:`ClusterState`; this module is where "the
cache has not synced", "this replica is not the leader" and "explain at most N failed nodes" are
decided. It imports only the core (and the row lookups of :mod:`gpupool.extender.node_rows`): the
Kubernetes cache and binder plug in through the two small protocols below (:class:`Ledger`,
:class:`PodBinder`), as architecture.md's layering asks. Answers carry ledger rows and a layout
number, never an adapter's encoding: an adapter that writes answers from per-row data keeps that
data itself, keyed by the number (:meth:`ExtenderService.row_names`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from gpupool.core.feasibility import request_problem
from gpupool.core.fragmentation import FloatArray, WorkloadProfile
from gpupool.core.lent_view import PolicyFactory
from gpupool.core.model import Placement, PodRequest
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState, IntArray
from gpupool.extender.booking_keeper import ASSUMED_REFUSED, ASSUMED_REPLACED, pinned_elsewhere
from gpupool.extender.node_ranking import MAX_EXTENDER_PRIORITY as MAX_EXTENDER_PRIORITY  # re-exported
from gpupool.extender.node_ranking import (
    TIED_NOT_FIRST,
    TieRanks,
    best_nodes,
    has_soft_preferences,
    stable_rank,
)
from gpupool.extender.node_ranking import NodeScores as NodeScores
from gpupool.extender.node_ranking import scale_scores as scale_scores
from gpupool.extender.node_rows import NodeRows
from gpupool.extender.preemption import NodeGate as NodeGate  # re-exported
from gpupool.extender.preemption import NoFollowUp, PreemptAnswers, PreemptLedger, answer_preemption
from gpupool.kube.refusal_texts import alias_problem, with_outside
from gpupool.kube.tenancy import PodTenancy
from gpupool.kube.tenancy_layers import Admission

NOT_SYNCED = "gpupool extender: the cluster cache has not synced yet; retry shortly"
UNKNOWN_NODE = "node is not in the gpupool extender's cache"
NO_ROWS: IntArray = np.zeros(0, dtype=np.int64)
NO_ROWS.flags.writeable = False


class BorrowerPlacement(Protocol):
    """Places a pod on lent capacity when no owned capacity holds it (:class:`gpupool.extender.borrowing.Lending`)."""

    def place(self, state: ClusterState, request: PodRequest, rows: IntArray, policy: PolicyFactory,
              profile: WorkloadProfile | None, explain_limit: int,
              pod: Mapping[str, Any] | None = None) -> tuple[IntArray, FloatArray, dict[int, str]]:
        """The rows among ``rows`` whose loans can hold the pod, their scores, and per row a note."""


class Ledger(PreemptLedger, Protocol):
    """What the four verbs read and book: the booked cluster state and its scheduler, why nodes are
    refused, the filter's assumptions, and readiness (with :class:`PreemptLedger`'s reads for preempt).

    Only what the service calls: the ledger's figures for ``/metrics``
    (:class:`gpupool.extender.metrics.LedgerFigures`), the webhooks' and the quota status's reads
    (each declares its own) and the housekeeping's are no part of it; wiring code hands those
    consumers the concrete :class:`gpupool.extender.cache.ClusterCache`, which implements them all.
    """

    scheduler: Scheduler
    node_problems: dict[str, str]
    """Per node whose object the ledger cannot read, why no GPU pod is placed there."""
    share_refusals: dict[str, str]
    """Per node that takes whole GPUs only, why (no GPU slice is placed there)."""
    served_aliases: dict[str, frozenset[str]]
    """Per node, the foreign resource aliases its kubelet advertises (see :func:`alias_problem`)."""
    served_aliases_version: int
    """Moves whenever ``served_aliases`` changes, so per-alias node masks can be cached."""
    soft_tainted: set[str]  # nodes with a PreferNoSchedule taint (gpupool/extender/node_ranking.py)

    @property
    def synced(self) -> bool:
        """True once the ledger reflects a full list of nodes and pods."""

    @property
    def claim_problems(self) -> dict[str, str]:
        """Per node holding a pod whose assignment cannot be read, why GPU pods are refused there."""

    @property
    def lending(self) -> BorrowerPlacement:
        """Who may borrow lent capacity and which waiting pod first (:mod:`gpupool.extender.borrowing`)."""

    def admit(self, request: PodRequest, tenant: PodTenancy | None, node: str | None = None) -> Admission:
        """The pod under its group, quotas and card controls (call with the lock held)."""

    def assume(self, asked: PodRequest, admission: Admission, node: str, hold_s: float) -> Placement | None:
        """Book the filter's choice on the one node it passes until the pod's bind (``ASSUMED``)."""

    def unassume(self, key: str, why: str) -> None:
        """End the filter's assumption for pod ``key``, if it has one."""

    def drop_lapsed(self) -> list[str]:
        """End the assumptions past their deadline."""

    def pinned_node(self, key: str, uid: str = "") -> str | None:
        """The node an earlier bind of pod ``key`` (of ``uid``; "": any) bound it to, or may have,
        while the watch has not shown that write; None when there is no such write."""


class RefusedPods(Protocol):
    """Hears of every pod the filter passed no node for (see :mod:`gpupool.extender.wakeup`)."""

    def refused(self, request: PodRequest, aliases: frozenset[str], tenant: PodTenancy | None,
                pod: Mapping[str, Any] | None) -> None:
        """Pod ``request.key`` fits no node asked about; kube-scheduler parks it until an event."""


class NoRefusals:
    """Nobody listens (tests, and replicas without the wake-up)."""

    def refused(self, request: PodRequest, aliases: frozenset[str], tenant: PodTenancy | None,
                pod: Mapping[str, Any] | None) -> None:
        return None


@dataclass(frozen=True)
class BindResult:
    """The outcome of one bind: ``error`` empty on success; ``placement`` the cards chosen."""

    error: str = ""
    placement: Placement | None = None
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return not self.error


class PodBinder(Protocol):
    """Chooses the cards on the node, records them and binds (see gpupool.extender.binder)."""

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        """Bind the pod to ``node``; errors are returned, never raised."""


@dataclass
class FilterOutcome:
    """Nodes that passed (in request order), reasons for the others, or an error for the whole call.

    ``rows``: when set, the ledger rows of ``passed`` (``rows[i]`` is ``passed[i]`` in the layout
    numbered ``layout``, see :meth:`ExtenderService.row_names`).
    """

    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    error: str = ""
    rows: IntArray | None = None
    layout: int | None = None


@dataclass(frozen=True)
class _FilterMemo:
    """The last filter's feasible nodes and their raw policy scores, for prioritize to reuse.

    kube-scheduler asks prioritize about the same pod right after filter, with exactly the nodes
    that passed. While the ledger has not changed in between (same state object, same booking and
    layout versions, same served aliases) the scores filter computed are the scores prioritize
    would compute, so it skips mapping 5,000 names to rows and scoring them again.
    """

    request: PodRequest
    aliases: frozenset[str]
    state: ClusterState
    versions: tuple[int, int, int, int]
    passed: list[str]
    rows: IntArray
    scores: FloatArray


@dataclass(frozen=True)
class _Feasible:
    """What :meth:`ExtenderService._feasible` found: the nodes that passed (request order), their
    rows and scores, reasons for the others, and the rows of every node asked about (-1 where the
    ledger does not have it; None when the request failed before nodes were looked at)."""

    passed: list[str]
    passed_rows: IntArray
    scores: FloatArray
    failed: dict[str, str]
    asked_rows: IntArray | None


DEFAULT_ASSUME_S = 12.0
"""How long a filter's assumption waits for its pod's bind: a little above the 10 s ``httpTimeout``
that deploy/ gives kube-scheduler for the extender. kube-scheduler binds right after the scheduling
cycle that filtered the pod, and a bind request outlives no ``httpTimeout``, so past this no bind of
that decision is coming (a later extender or plugin refused the pod, or a Permit plugin held it)."""


@dataclass(frozen=True)
class ExtenderSettings:
    """Tunables of the service (the CLI exposes each as a flag, and its defaults are these: an
    ``ExtenderSettings()`` is the extender users run)."""

    explain_limit: int = 64
    """Failed nodes explained one by one; the rest share a summary (explaining a node is a scalar
    walk of its cards, too slow to do for thousands of nodes per call)."""
    filter_best_only: bool = True
    """Pass only the nodes the policy scores best (gpupool/extender/node_ranking.py), for a
    kube-scheduler configured without ``prioritizeVerb`` (the shipped configurations); False passes
    every node that fits, for the ``-prioritize.yaml`` variants."""
    filter_one_best: bool = True
    """With ``filter_best_only``: pass one of the best nodes, the first in a fixed node order, unless
    the pod has soft preferences or a best node a ``PreferNoSchedule`` taint (gpupool/extender/node_ranking.py)."""
    assume_s: float = DEFAULT_ASSUME_S
    """How long the filter's choice for a pod it passes one node stays booked (``ASSUMED``) when no
    bind of the pod comes (docs/extender.md, "Assumed bookings")."""
    tie_rank: Callable[[str], int] = stable_rank
    """The fixed node order of ``filter_one_best`` (lower first); the fidelity bench sets the
    simulator's."""


class ExtenderService:
    """Answers the four extender verbs from a :class:`Ledger`."""

    def __init__(self, cache: Ledger, binder: PodBinder | None, *,
                 settings: ExtenderSettings | None = None,
                 is_leader: Callable[[], bool] = lambda: True,
                 leader_name: Callable[[], str] = lambda: "", node_gate: NodeGate = lambda _: {},
                 preempt_answers: PreemptAnswers | None = None,
                 bind_refusal: Callable[[], str] = lambda: "",
                 refused: RefusedPods | None = None) -> None:
        self.cache = cache
        self.bind_refusal = bind_refusal
        """Why binds are refused now ("" when a bind would be tried): the fence's, see :meth:`unready`."""
        self.refused = refused or NoRefusals()
        self.preempt_answers = preempt_answers or NoFollowUp()
        self.node_gate = node_gate
        self.binder = binder
        self.settings = settings or ExtenderSettings()
        self.is_leader = is_leader
        self.leader_name = leader_name
        self.node_rows = NodeRows()
        self.tie_ranks = TieRanks(self.settings.tie_rank)
        """The fixed node order the one best node is taken in (gpupool/extender/node_ranking.py)."""
        self._last_filter: _FilterMemo | None = None

    def unready(self) -> str:
        """Why this replica should get no kube-scheduler traffic now ("" when it should).

        Ready means a bind sent here would be tried: the cache synced and, under leader election,
        this replica leads and its term has caught up. Only such a replica is a Ready endpoint of
        the Service kube-scheduler calls, so kube-scheduler never meets "not the leader" (a
        follower's filter would do, but its bind could not) and a new leader gets traffic as soon
        as it may bind (docs/extender.md, "High availability").
        """
        if not self.cache.synced:
            return "cache not synced"
        if self.binder is None:
            return ""
        if not self.is_leader():
            leader = self.leader_name()
            return "not the leader" + (f"; the leader is {leader}" if leader else "")
        return self.bind_refusal()  # catching up after becoming leader

    def row_names(self, layout: int) -> tuple[str, ...] | None:
        """The node name of every ledger row in the layout numbered ``layout`` (the ``layout`` of an
        answer), or None once the ledger's rows have changed names since. The number moves only
        when a row's name changes, so per-row data an adapter keeps by it stays valid meanwhile."""
        return self.node_rows.names(layout)

    def _admit(self, request: PodRequest, tenant: PodTenancy | None) -> Admission:
        """The pod under its group, quotas and card controls (call with the cache lock held)."""
        return self.cache.admit(request, tenant)

    def _feasible(self, admission: Admission, names: list[str], aliases: frozenset[str] = frozenset(),
                  explain: bool = True, explain_if_passed: bool = True,
                  pod: Mapping[str, Any] | None = None) -> _Feasible:
        """The nodes among ``names`` that can hold ``request`` (in request order), their ledger rows
        and policy scores, and a reason for every other node (for nodes rejected by the GPU check only when
        ``explain``, and unless ``explain_if_passed`` only when none passed: prioritize has no use for
        them, nor has a best-only answer with a node in it). Must be called with the cache lock held.

        ``aliases``: the foreign resource names the pod uses; a node qualifies only if it serves
        every one of them. ``pod``: the object asked about, for the borrower rules."""
        state = self.cache.state
        request = admission.request
        problem = admission.error or request_problem(state, request)
        if problem is not None:
            return _Feasible([], NO_ROWS, np.zeros(0), dict.fromkeys(names, problem), None)
        rows, name_array = self.node_rows.rows(state, names)
        usable = rows >= 0
        failed: dict[str, str] = dict.fromkeys(name_array[~usable].tolist(), UNKNOWN_NODE)
        shares_refused = self.cache.share_refusals if request.wants_share else {}
        if request.remote and shares_refused:  # a node without cards runs a remote share's client only
            shares_refused = {name: why for name, why in shares_refused.items()
                              if name in state.index and state.card_count[state.index[name]] > 0}
        refused = {**shares_refused, **self.cache.claim_problems, **self.cache.node_problems, **self.node_gate(state)}
        if refused:
            asked = set(names)
            for name, reason in refused.items():
                row = state.index.get(name)
                if row is not None and name in asked:
                    usable &= rows != row
                    failed[name] = reason
        # group, pools, pins, quota models (a pod no tenancy object reaches has no layer to refuse by)
        outside = admission.refuse_nodes(state, rows, usable, name_array) if admission.layers else []
        if aliases:
            known = np.flatnonzero(usable)  # rows >= 0 there, so they index the mask
            serving = self.node_rows.serving(state, aliases, self.cache.served_aliases,
                                             self.cache.served_aliases_version)
            lacking = known[~serving[rows[known]]]
            usable[lacking] = False
            for i in lacking.tolist():
                name = names[i]
                failed[name] = alias_problem(aliases, self.cache.served_aliases.get(name, frozenset())) or ""
        candidates = rows[usable]
        if not len(candidates):
            return _Feasible([], NO_ROWS, np.zeros(0), with_outside(failed, outside, []) if outside else failed, rows)
        ok_rows, scores = self.cache.scheduler.filter_and_score(request, candidates)
        lent: dict[int, str] = {}  # free capacity first; lent capacity only where none is free
        if not len(ok_rows) and state.lent.lending_rows():
            ok_rows, scores, lent = self.cache.lending.place(state, request, candidates, self.cache.new_policy,
                                                             self.cache.profile, self.settings.explain_limit, pod)
        score_of = np.full(state.size, np.nan)
        score_of[ok_rows] = scores
        candidate_scores = score_of[candidates]
        fits = ~np.isnan(candidate_scores)
        candidate_names = name_array[usable]
        rejected = candidates[~fits]
        limit = self.settings.explain_limit
        if len(rejected) and explain and (explain_if_passed or not fits.any()):
            explained = self.cache.scheduler.explain(request, rejected[:limit])
            for row in rejected[:limit]:
                name = state.specs[int(row)].name
                failed[name] = explained.get(name, "does not fit") + lent.get(int(row), "")
            summary = f"insufficient GPU capacity for the request (reasons given for {limit} nodes only)"
            failed.update(dict.fromkeys(candidate_names[~fits][limit:].tolist(), summary))
        passed: list[str] = candidate_names[fits].tolist()
        passed_rows = candidates[fits]
        if len(passed) != len(names):
            # kube-scheduler's prioritize then asks about exactly the nodes that passed: their rows
            # are known here, so that call skips mapping thousands of names to rows again
            self.node_rows.remember(state, passed, (passed_rows, candidate_names[fits]))
        if outside:  # nodes outside the pod's group, pools or card controls (none without tenancy objects)
            failed = with_outside(failed, outside, passed)
        return _Feasible(passed, passed_rows, candidate_scores[fits], failed, rows)

    # -------------------------------------------------------------------------------- verbs
    def filter(self, request: PodRequest, names: list[str], aliases: frozenset[str] = frozenset(),
               tenant: PodTenancy | None = None, *, reasons_if_passed: bool = True,
               pod: Mapping[str, Any] | None = None) -> FilterOutcome:
        """Nodes that can hold every GPU container of the pod (and serve the foreign ``aliases`` it
        uses, and are open to its ``tenant``'s group, pools and quotas), with a reason for each
        other node (``reasons_if_passed=False``: the GPU check's only when no node passed, for an
        answer that carries reasons only then, see ``ExtenderApi._reasons_needed``). ``pod``: the
        object kube-scheduler sent, which the borrower rules read when the watch has not delivered
        the pod yet.

        An answer that passes one node books the pod's cards there (``ASSUMED``) until its bind, so
        the filters of other pods that come before that bind decide on a ledger that holds it; the
        pod's own earlier assumption is lifted first (this answer replaces it). A pod whose earlier
        bind's write the watch has not shown yet is passed that node alone (:meth:`_pinned`)."""
        if not request.wants_gpu:
            return FilterOutcome(passed=list(names))
        if not self.cache.synced:
            return FilterOutcome(error=NOT_SYNCED)
        with self.cache.lock:
            self.cache.drop_lapsed()
            self.cache.unassume(request.key, ASSUMED_REPLACED)
            pinned = self.cache.pinned_node(request.key, str(((pod or {}).get("metadata") or {}).get("uid") or ""))
            if pinned is not None:
                return self._pinned(request, names, aliases, tenant, pod, pinned)
            admission = self._admit(request, tenant)
            found = self._feasible(admission, names, aliases, explain_if_passed=reasons_if_passed, pod=pod)
            if not found.passed and names:
                self.refused.refused(request, aliases, tenant, pod)
            if self.settings.filter_best_only:
                best = best_nodes(found.passed, found.passed_rows, found.scores, reasons=reasons_if_passed)
                failed = {**found.failed, **best.not_best} if best.not_best else found.failed
                found = replace(found, passed=best.passed, passed_rows=best.rows, scores=best.scores,
                                failed=failed)
                tainted = self.cache.soft_tainted  # kube-scheduler weighs PreferNoSchedule among the best
                if (self.settings.filter_one_best and found.passed and not has_soft_preferences(pod)
                        and (not tainted or tainted.isdisjoint(found.passed))):
                    found = self._one_best(found, reasons_if_passed)
            if len(found.passed) == 1:  # kube-scheduler can only bind it there
                self.cache.assume(request, admission, found.passed[0], self.settings.assume_s)
            self._last_filter = _FilterMemo(admission.request, aliases, self.cache.state, self._versions(),
                                            found.passed, found.passed_rows, found.scores)
            layout = self.node_rows.layout(self.cache.state)
        return FilterOutcome(passed=found.passed, failed=found.failed, rows=found.passed_rows, layout=layout)

    def _pinned(self, request: PodRequest, names: list[str], aliases: frozenset[str], tenant: PodTenancy | None,
                pod: Mapping[str, Any] | None, pinned: str) -> FilterOutcome:
        """The answer for a pod that an earlier bind wrote (or may have written) onto node
        ``pinned``, a write the watch has not shown yet: that node alone, where its bind writes the
        pinned cards again (:meth:`gpupool.extender.booking_keeper.BookingKeeper.reserve`).

        Why: the ledger counts those cards, so a pod judged afresh competed with its own booking,
        and after a write that got no answer (or a 500) and was not applied, a node with room for
        one copy refused it until the pin ran out (120 s), with nothing to wake it then."""
        reason = pinned_elsewhere(request.key, pinned)
        passed = [pinned] if pinned in names else []
        if not passed and names:
            self.refused.refused(request, aliases, tenant, pod)
        self._last_filter = None
        return FilterOutcome(passed=passed, failed={name: reason for name in names if name != pinned})

    def fits_somewhere(self, request: PodRequest, aliases: frozenset[str] = frozenset(),
                       tenant: PodTenancy | None = None, pod: Mapping[str, Any] | None = None) -> bool:
        """Whether the pod would pass some node of the ledger now: the filter's checks over every
        node, without its memos and one-best bookkeeping (the wake-up asks this of pods it refused,
        :mod:`gpupool.extender.wakeup`). Nodes kube-scheduler's own plugins would refuse count too:
        a yes means "may fit", which is what a retry is for."""
        if not self.cache.synced:
            return False
        with self.cache.lock:
            state = self.cache.state
            names = [spec.name for spec, present in zip(state.specs, state.present, strict=False) if present]
            if not names:
                return False
            found = self._feasible(self._admit(request, tenant), names, aliases, explain=False, pod=pod)
        return bool(found.passed)

    def _one_best(self, found: _Feasible, reasons: bool) -> _Feasible:
        """Only the best node first in the fixed node order; the others get :data:`TIED_NOT_FIRST`.
        No node is skipped for a pod whose bind has not come yet: that pod's assumption is in the
        ledger, so a node it filled is no longer among the best (or no longer fits)."""
        first = self.tie_ranks.first(self.cache.state, found.passed_rows) if len(found.passed) > 1 else 0
        failed = found.failed
        if reasons and len(found.passed) > 1:
            failed = {**failed, **dict.fromkeys((n for i, n in enumerate(found.passed) if i != first), TIED_NOT_FIRST)}
        return replace(found, passed=[found.passed[first]], passed_rows=found.passed_rows[first:first + 1],
                       scores=found.scores[first:first + 1], failed=failed)

    def _versions(self) -> tuple[int, int, int, int]:
        state = self.cache.state
        return (state.version, state.layout_version, self.cache.served_aliases_version,
                self.cache.admissions.book.version)

    def _reusable_filter(self, request: PodRequest, names: list[str],
                         aliases: frozenset[str]) -> _FilterMemo | None:
        """The last filter's memo when it answers this prioritize exactly (see :class:`_FilterMemo`);
        never while some node is refused for a problem (those are checked afresh on every call)."""
        memo = self._last_filter
        if (memo is None or self.cache.node_problems or self.cache.claim_problems or self.cache.share_refusals
                or self.node_gate(self.cache.state)
                or memo.state is not self.cache.state
                or memo.versions != self._versions() or memo.aliases != aliases
                or memo.request != request or memo.passed != names):
            return None
        return memo

    def prioritize(self, request: PodRequest, names: list[str], aliases: frozenset[str] = frozenset(),
                   tenant: PodTenancy | None = None) -> tuple[NodeScores, str]:
        """Scores 0..10 per node from the placement policy (infeasible nodes 0), and an error."""
        if not request.wants_gpu:
            return NodeScores.uniform(names), ""
        if not self.cache.synced:
            return NodeScores.uniform([]), NOT_SYNCED
        with self.cache.lock:
            admission = self._admit(request, tenant)
            memo = self._reusable_filter(admission.request, names, aliases)
            layout = self.node_rows.layout(self.cache.state)
            if memo is not None:
                # memo.passed holds the ledger's own name strings (hashes known): cheaper to look up
                # than the freshly decoded ``names`` it equals
                scaled = scale_scores(memo.passed, memo.scores, memo.passed)
                return NodeScores(scaled.hosts, scaled.scores, memo.rows, layout), ""
            found = self._feasible(admission, names, aliases, explain=False)
        scaled = scale_scores(found.passed, found.scores, names)
        asked = found.asked_rows
        if asked is not None and len(asked) and asked.min() >= 0:  # every node asked about is in the ledger
            return NodeScores(scaled.hosts, scaled.scores, asked, layout), ""
        return scaled, ""

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        """Bind on the leader only; elsewhere answer an error so kube-scheduler retries. Either way
        the pod's assumption ends: a bind that books the pod took it over as its reservation, and
        one that did not leaves nothing for it to wait for."""
        try:
            return self._bind(namespace, name, uid, node)
        finally:
            self.cache.unassume(f"{namespace}/{name}", ASSUMED_REFUSED)

    def refuse_bind(self, namespace: str, name: str) -> BindResult | None:
        """The answer to a bind this replica would not take now (a follower, a new term catching up),
        or None when it would try it: the same refusal as :meth:`bind`, without a bind thread.

        Why: binds run on a pool of threads, and a leader cut from the apiserver keeps those threads
        waiting on the writes it began before it stepped down (each up to its time-out); a refusal
        queued behind them reached kube-scheduler seconds late (8 s after the cut in the partition
        e2e, against 5 s for the filter's). A refusal reads and writes nothing, so it needs no
        thread. The pod's assumption ends, as in :meth:`bind`.
        """
        if self.binder is None or not self.cache.synced:
            return None
        if self.is_leader():
            error = self.bind_refusal()
            if not error:
                return None
        else:
            leader = self.leader_name()
            error = "this gpupool extender replica is not the leader" + (f"; the leader is {leader}" if leader else "")
        self.cache.unassume(f"{namespace}/{name}", ASSUMED_REFUSED)
        return BindResult(error)

    def _bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        if self.binder is None:
            return BindResult("this gpupool extender was started without binding")
        if not self.cache.synced:
            return BindResult(NOT_SYNCED)
        if not self.is_leader():
            leader = self.leader_name()
            return BindResult("this gpupool extender replica is not the leader"
                              + (f"; the leader is {leader}" if leader else ""))
        gated = self.node_gate(self.cache.state).get(node)
        return BindResult(gated) if gated else self.binder.bind(namespace, name, uid, node)

    def preempt(self, request: PodRequest, victims: Mapping[str, list[str]],
                tenant: PodTenancy | None = None, own_claims: Collection[str] = ()) -> tuple[dict[str, list[str]], str]:
        """Per proposed node, the victims (uids) whose eviction frees the cards the pod needs
        (:func:`gpupool.extender.preemption.answer_preemption`); ``own_claims``: the keys of the
        pod's allocated DRA claims, whose cards the victims must free too."""
        if not request.wants_gpu and not own_claims:
            return dict(victims), ""
        if not self.cache.synced:
            return {}, NOT_SYNCED
        if request.remote:  # evictions on the pod's node free no server card: a remote share preempts nobody
            return {}, ""
        return answer_preemption(self.cache, request, victims, tenant, self.node_gate, self.preempt_answers,
                                 own_claims), ""
