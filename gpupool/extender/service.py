"""The extender's decisions: filter, prioritize, bind and preempt over a GPU ledger and the core.

Why a service between HTTP and the core: the HTTP adapter only speaks the wire format and Kubernetes
JSON, the core only speaks :class:`PodRequest`/:class:`ClusterState`; this module is where "the
cache has not synced", "this replica is not the leader" and "explain at most N failed nodes" are
decided. It imports only the core: the Kubernetes cache and binder plug in through the two small
protocols below (:class:`Ledger`, :class:`PodBinder`), as architecture.md's layering asks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gpupool.api.names import ALIAS_FAMILIES, UNSERVABLE
from gpupool.core.feasibility import request_problem
from gpupool.core.fragmentation import FloatArray
from gpupool.core.model import Placement, PodRequest
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import AllocationError, BoolArray, ClusterState, IntArray

log = logging.getLogger(__name__)

NOT_SYNCED = "gpupool extender: the cluster cache has not synced yet; retry shortly"
UNKNOWN_NODE = "node is not in the gpupool extender's cache"
RowsAndNames = tuple[IntArray, npt.NDArray[np.object_]]
NO_ROWS: IntArray = np.zeros(0, dtype=np.int64)
NO_ROWS.flags.writeable = False
MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler's MaxExtenderPriority: extender scores are integers 0..10."""


class Ledger(Protocol):
    """What the service reads: the booked cluster state, its scheduler, and readiness.

    :class:`gpupool.extender.cache.ClusterCache` is the implementation fed by the API.
    """

    lock: threading.RLock
    state: ClusterState
    scheduler: Scheduler
    node_problems: dict[str, str]
    served_aliases: dict[str, frozenset[str]]
    """Per node, the foreign resource aliases its kubelet advertises (see :func:`alias_problem`)."""
    served_aliases_version: int
    """Moves whenever ``served_aliases`` changes, so per-alias node masks can be cached."""

    @property
    def synced(self) -> bool:
        """True once the ledger reflects a full list of nodes and pods."""

    def key_for_uid(self, uid: str) -> str | None:
        """``namespace/name`` of a known GPU pod by uid."""


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


@dataclass(frozen=True, eq=False)
class LedgerRows:
    """The ledger's node names by row.

    Why: answers name up to 5,000 nodes per call, and an HTTP adapter can write them fastest from
    per-row records it prepares once (:mod:`gpupool.extender.http.host_records`). Answers therefore
    carry their ledger rows and this object; its *identity* says which rows mean which names: the
    service makes a new one whenever a row's name changes (a node added, or the ledger state
    replaced), so a record table kept for one object is never read with rows of another naming.
    """

    names: tuple[str, ...]


@dataclass
class FilterOutcome:
    """Nodes that passed (in request order), reasons for the others, or an error for the whole call.

    ``rows``: when set, the ledger rows of ``passed`` (``rows[i]`` is ``passed[i]`` in ``layout``).
    """

    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    error: str = ""
    rows: IntArray | None = None
    layout: LedgerRows | None = None


@dataclass(frozen=True)
class NodeScores:
    """Prioritize's answer: ``scores[i]`` (0..10) for ``hosts[i]``, in the order asked.

    Why two aligned sequences and not a dict: the answer has an entry per node (5,000) on every
    call; zipping them into a dict and walking it again to write JSON cost ~1.5 ms of the ~3 ms
    prioritize took. The HTTP adapter writes the JSON straight from the array.

    ``rows``: when set, the ledger row of every host (``rows[i]`` is ``hosts[i]`` in ``layout``),
    so the adapter can write the answer from per-row records.
    """

    hosts: list[str]
    scores: IntArray
    rows: IntArray | None = None
    layout: LedgerRows | None = None

    @staticmethod
    def uniform(hosts: list[str], score: int = 0) -> NodeScores:
        return NodeScores(hosts, np.full(len(hosts), score, dtype=np.int64))

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self.hosts, self.scores.tolist(), strict=True))


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
    versions: tuple[int, int, int]
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


@dataclass(frozen=True)
class _RowsEntry:
    """A node list seen before, with its ledger rows (see :meth:`ExtenderService._rows`)."""

    names: list[str]
    state: ClusterState
    layout_version: int
    found: RowsAndNames


@dataclass(frozen=True)
class ExtenderSettings:
    """Tunables of the service (the CLI exposes each as a flag)."""

    explain_limit: int = 64
    """Failed nodes explained one by one; the rest share a summary (explaining is ~50 µs a node)."""


class ExtenderService:
    """Answers the four extender verbs from a :class:`Ledger`."""

    def __init__(self, cache: Ledger, binder: PodBinder | None, *,
                 settings: ExtenderSettings | None = None,
                 is_leader: Callable[[], bool] = lambda: True,
                 leader_name: Callable[[], str] = lambda: "") -> None:
        self.cache = cache
        self.binder = binder
        self.settings = settings or ExtenderSettings()
        self.is_leader = is_leader
        self.leader_name = leader_name
        self._rows_cache: list[_RowsEntry] = []
        self._layout_memo: tuple[ClusterState, int, LedgerRows] | None = None
        self._serving: dict[tuple[frozenset[str], int, int], BoolArray] = {}
        self._last_filter: _FilterMemo | None = None

    def _rows(self, names: list[str]) -> RowsAndNames:
        """Ledger rows of ``names`` (-1 where unknown) and the names as an array, cached.

        kube-scheduler sends the same node list call after call, so the mapping is kept for the last
        lists seen and reused while the ledger's set of nodes is unchanged. A list is recognised by
        comparing it with the remembered ones (``==`` stops at the first differing name, or at once
        when the lengths differ): ~0.1 ms for 5,000 names, where hashing a tuple of them as a dict
        key took ~0.3 ms. The remembered lists are the request's own (never changed afterwards).
        """
        state = self.cache.state
        for position, entry in enumerate(self._rows_cache):
            if entry.state is state and entry.layout_version == state.layout_version and entry.names == names:
                if position:  # most recently used first: the full node list, asked by every filter, stays
                    self._rows_cache.insert(0, self._rows_cache.pop(position))
                return entry.found
        rows = np.fromiter(map(state.index.get, names, repeat(-1)), dtype=np.int64, count=len(names))
        known = rows >= 0
        known[known] = state.present[rows[known]]
        rows[~known] = -1
        found = (rows, np.array(names, dtype=object))
        self._remember_rows(names, found)
        return found

    def _remember_rows(self, names: list[str], found: RowsAndNames) -> None:
        # layout_version moves whenever a node is added, replaced or removed: exact, where the former
        # (rows, nodes present) pair could not tell one node leaving while another came back
        state = self.cache.state
        self._rows_cache.insert(0, _RowsEntry(names, state, state.layout_version, found))
        del self._rows_cache[8:]  # filter's and prioritize's lists of a few pod shapes

    def _layout(self) -> LedgerRows:
        """The :class:`LedgerRows` of the ledger as it is now: the same object until a row's name
        changes or the ledger state is replaced."""
        state = self.cache.state
        known = self._layout_memo
        if known is None or known[0] is not state or known[1] != state.layout_version:
            names = tuple(spec.name for spec in state.specs)
            # a node replaced (labels, inventory) or removed keeps every row's name: keep the object,
            # so the adapter's record table (~3 ms to build for 5,000 nodes) is not rebuilt
            rows = known[2] if known is not None and known[2].names == names else LedgerRows(names)
            known = (state, state.layout_version, rows)
            self._layout_memo = known
        return known[2]

    def _feasible(self, request: PodRequest, names: list[str], aliases: frozenset[str] = frozenset(),
                  explain: bool = True) -> _Feasible:
        """The nodes among ``names`` that can hold ``request`` (in request order), their ledger rows
        and policy scores, and a reason for every other node (for nodes rejected by the GPU check only when
        ``explain``: prioritize has no use for them). Must be called with the cache lock held.

        ``aliases``: the foreign resource names the pod uses; a node qualifies only if it serves
        every one of them."""
        state = self.cache.state
        problem = request_problem(state, request)
        if problem is not None:
            return _Feasible([], NO_ROWS, np.zeros(0), dict.fromkeys(names, problem), None)
        rows, name_array = self._rows(names)
        usable = rows >= 0
        failed: dict[str, str] = dict.fromkeys(name_array[~usable].tolist(), UNKNOWN_NODE)
        if self.cache.node_problems:
            asked = set(names)
            for name, reason in self.cache.node_problems.items():
                row = state.index.get(name)
                if row is not None and name in asked:
                    usable &= rows != row
                    failed[name] = reason
        if aliases:
            known = np.flatnonzero(usable)  # rows >= 0 there, so they index the mask
            lacking = known[~self._serving_rows(aliases)[rows[known]]]
            usable[lacking] = False
            for i in lacking.tolist():
                name = names[i]
                failed[name] = alias_problem(aliases, self.cache.served_aliases.get(name, frozenset())) or ""
        candidates = rows[usable]
        if not len(candidates):
            return _Feasible([], NO_ROWS, np.zeros(0), failed, rows)
        ok_rows, scores = self.cache.scheduler.filter_and_score(request, candidates)
        score_of = np.full(state.size, np.nan)
        score_of[ok_rows] = scores
        candidate_scores = score_of[candidates]
        fits = ~np.isnan(candidate_scores)
        candidate_names = name_array[usable]
        rejected = candidates[~fits]
        limit = self.settings.explain_limit
        if len(rejected) and explain:
            explained = self.cache.scheduler.explain(request, rejected[:limit])
            for row in rejected[:limit]:
                name = state.specs[int(row)].name
                failed[name] = explained.get(name, "does not fit")
            summary = f"insufficient GPU capacity for the request (reasons given for {limit} nodes only)"
            failed.update(dict.fromkeys(candidate_names[~fits][limit:].tolist(), summary))
        passed: list[str] = candidate_names[fits].tolist()
        passed_rows = candidates[fits]
        if len(passed) != len(names):
            # kube-scheduler's prioritize then asks about exactly the nodes that passed: their rows
            # are known here, so that call skips mapping 5,000 names to rows again (~0.5 ms)
            self._remember_rows(passed, (passed_rows, candidate_names[fits]))
        return _Feasible(passed, passed_rows, candidate_scores[fits], failed, rows)

    def _serving_rows(self, aliases: frozenset[str]) -> BoolArray:
        """Per ledger row, does the node serve every alias in ``aliases``; cached until the ledger's
        nodes or their advertised aliases change (kube-scheduler asks about 5,000 names per call)."""
        state = self.cache.state
        key = (aliases, state.layout_version, self.cache.served_aliases_version)
        found = self._serving.get(key)
        if found is None:
            served = self.cache.served_aliases
            found = np.fromiter((aliases <= served.get(spec.name, frozenset()) for spec in state.specs),
                                dtype=bool, count=len(state.specs))
            self._serving = {key: found}
        return found

    # -------------------------------------------------------------------------------- verbs
    def filter(self, request: PodRequest, names: list[str],
               aliases: frozenset[str] = frozenset()) -> FilterOutcome:
        """Nodes that can hold every GPU container of the pod (and serve the foreign ``aliases`` it
        uses), with a reason for each other node."""
        if not request.wants_gpu:
            return FilterOutcome(passed=list(names))
        if not self.cache.synced:
            return FilterOutcome(error=NOT_SYNCED)
        with self.cache.lock:
            found = self._feasible(request, names, aliases)
            self._last_filter = _FilterMemo(request, aliases, self.cache.state, self._versions(), found.passed,
                                            found.passed_rows, found.scores)
            layout = self._layout()
        return FilterOutcome(passed=found.passed, failed=found.failed, rows=found.passed_rows, layout=layout)

    def _versions(self) -> tuple[int, int, int]:
        state = self.cache.state
        return state.version, state.layout_version, self.cache.served_aliases_version

    def _reusable_filter(self, request: PodRequest, names: list[str],
                         aliases: frozenset[str]) -> _FilterMemo | None:
        """The last filter's memo when it answers this prioritize exactly (see :class:`_FilterMemo`);
        never while some node has a problem (those are checked afresh on every call)."""
        memo = self._last_filter
        if (memo is None or self.cache.node_problems or memo.state is not self.cache.state
                or memo.versions != self._versions() or memo.aliases != aliases
                or memo.request != request or memo.passed != names):
            return None
        return memo

    def prioritize(self, request: PodRequest, names: list[str],
                   aliases: frozenset[str] = frozenset()) -> tuple[NodeScores, str]:
        """Scores 0..10 per node from the placement policy (infeasible nodes 0), and an error."""
        if not request.wants_gpu:
            return NodeScores.uniform(names), ""
        if not self.cache.synced:
            return NodeScores.uniform([]), NOT_SYNCED
        with self.cache.lock:
            memo = self._reusable_filter(request, names, aliases)
            layout = self._layout()
            if memo is not None:
                # memo.passed holds the ledger's own name strings (hashes known): cheaper to look up
                # than the freshly decoded ``names`` it equals
                scaled = scale_scores(memo.passed, memo.scores, memo.passed)
                return NodeScores(scaled.hosts, scaled.scores, memo.rows, layout), ""
            found = self._feasible(request, names, aliases, explain=False)
        scaled = scale_scores(found.passed, found.scores, names)
        asked = found.asked_rows
        if asked is not None and len(asked) and asked.min() >= 0:  # every node asked about is in the ledger
            return NodeScores(scaled.hosts, scaled.scores, asked, layout), ""
        return scaled, ""

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        """Bind on the leader only; elsewhere answer an error so kube-scheduler retries."""
        if self.binder is None:
            return BindResult("this gpupool extender was started without binding")
        if not self.cache.synced:
            return BindResult(NOT_SYNCED)
        if not self.is_leader():
            leader = self.leader_name()
            return BindResult("this gpupool extender replica is not the leader"
                              + (f"; the leader is {leader}" if leader else ""))
        return self.binder.bind(namespace, name, uid, node)

    def preempt(self, request: PodRequest,
                victims: Mapping[str, list[str]]) -> tuple[dict[str, list[str]], str]:
        """Keep the nodes where evicting the proposed victims (uids per node) frees enough GPU.

        The victims' bookings are lifted one node at a time, the pod is tried with the core, and the
        bookings are put back exactly, all under the cache lock.
        """
        if not request.wants_gpu:
            return dict(victims), ""
        if not self.cache.synced:
            return {}, NOT_SYNCED
        kept: dict[str, list[str]] = {}
        with self.cache.lock:
            state = self.cache.state
            for node, uids in victims.items():
                keys = [k for k in (self.cache.key_for_uid(u) for u in uids) if k is not None]
                lifted: list[Placement] = []
                for key in keys:
                    placement = state.placements.get(key)
                    if placement is not None and placement.node == node:
                        state.release(key)
                        lifted.append(placement)
                try:
                    decision = self.cache.scheduler.assign(request, node)
                finally:
                    for placement in lifted:
                        try:
                            state.apply(placement)
                        except AllocationError:  # pragma: no cover - they coexisted a moment ago
                            log.error("could not restore %s after a preemption check", placement.pod_key)
                if not isinstance(decision, Unschedulable):
                    kept[node] = list(uids)
        return kept, ""


def alias_problem(wanted: frozenset[str], served: frozenset[str]) -> str | None:
    """Why a node cannot take a pod's foreign aliases, or ``None`` when it serves them all.

    kubelet drops an extended resource its node does not advertise (it admits the pod and never
    calls a device plugin for it), so placing the pod there would start it without its GPU grant.
    """
    missing = sorted(wanted - served)
    if not missing:
        return None
    hints = sorted({UNSERVABLE[m] for m in missing if m in UNSERVABLE})
    if hints:
        return "; ".join(hints)
    families = sorted({f for f, members in ALIAS_FAMILIES.items() for m in missing if m in members})
    return (f"node does not serve {', '.join(missing)}: start its gpupool node agent with "
            f"--serve-aliases {','.join(families)}")


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
