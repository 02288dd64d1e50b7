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
from typing import Protocol

import numpy as np

from gpupool.core.feasibility import request_problem
from gpupool.core.model import Placement, PodRequest
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import AllocationError, ClusterState

log = logging.getLogger(__name__)

NOT_SYNCED = "gpupool extender: the cluster cache has not synced yet; retry shortly"
UNKNOWN_NODE = "node is not in the gpupool extender's cache"
MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler's MaxExtenderPriority: extender scores are integers 0..10."""


class Ledger(Protocol):
    """What the service reads: the booked cluster state, its scheduler, and readiness.

    :class:`gpupool.adapters.k8s.cache.ClusterCache` is the implementation fed by the API.
    """

    lock: threading.RLock
    state: ClusterState
    scheduler: Scheduler
    node_problems: dict[str, str]

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
    """Chooses the cards on the node, records them and binds (see gpupool.adapters.k8s.binder)."""

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        """Bind the pod to ``node``; errors are returned, never raised."""


@dataclass
class FilterOutcome:
    """Nodes that passed (in request order), reasons for the others, or an error for the whole call."""

    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    error: str = ""


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

    def _feasible(self, request: PodRequest, names: list[str]) -> tuple[dict[str, float], dict[str, str]]:
        """Scores of the nodes among ``names`` that can hold ``request``, and reasons for the others.

        Must be called with the cache lock held.
        """
        state = self.cache.state
        failed: dict[str, str] = {}
        problem = request_problem(state, request)
        if problem is not None:
            return {}, dict.fromkeys(names, problem)
        rows: list[int] = []
        for name in names:
            row = state.index.get(name)
            if row is None or not state.present[row]:
                failed[name] = UNKNOWN_NODE
            elif name in self.cache.node_problems:
                failed[name] = self.cache.node_problems[name]
            else:
                rows.append(row)
        if not rows:
            return {}, failed
        row_array = np.asarray(rows, dtype=np.int64)
        ok_rows, scores = self.cache.scheduler.filter_and_score(request, row_array)
        passed = {state.specs[int(r)].name: float(s) for r, s in zip(ok_rows, scores, strict=True)}
        rejected = np.setdiff1d(row_array, ok_rows)
        limit = self.settings.explain_limit
        if len(rejected):
            failed.update(self.cache.scheduler.explain(request, rejected[:limit]))
            for row in rejected[:limit]:
                failed.setdefault(state.specs[int(row)].name, "does not fit")
            for row in rejected[limit:]:
                failed[state.specs[int(row)].name] = (
                    f"insufficient GPU capacity for the request (reasons given for {limit} nodes only)")
        return passed, failed

    # -------------------------------------------------------------------------------- verbs
    def filter(self, request: PodRequest, names: list[str]) -> FilterOutcome:
        """Nodes that can hold every GPU container of the pod, with a reason for each other node."""
        if not request.wants_gpu:
            return FilterOutcome(passed=list(names))
        if not self.cache.synced:
            return FilterOutcome(error=NOT_SYNCED)
        with self.cache.lock:
            passed, failed = self._feasible(request, names)
        return FilterOutcome(passed=[n for n in names if n in passed], failed=failed)

    def prioritize(self, request: PodRequest, names: list[str]) -> tuple[dict[str, int], str]:
        """Scores 0..10 per node from the placement policy (infeasible nodes 0), and an error."""
        if not request.wants_gpu:
            return dict.fromkeys(names, 0), ""
        if not self.cache.synced:
            return {}, NOT_SYNCED
        with self.cache.lock:
            passed, _ = self._feasible(request, names)
        return scale_scores(passed, names), ""

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


def scale_scores(passed: dict[str, float], names: list[str]) -> dict[str, int]:
    """Map the policy's scores of feasible nodes onto 0..10 (min-max); other nodes get 0.

    The best feasible node always gets 10, so the extender's preference survives kube-scheduler's
    weighting even when the policy's raw differences are tiny.
    """
    result = dict.fromkeys(names, 0)
    if not passed:
        return result
    values = np.array(list(passed.values()), dtype=np.float64)
    low, high = float(values.min()), float(values.max())
    for name, score in passed.items():
        if high == low:
            result[name] = MAX_EXTENDER_PRIORITY
        else:
            result[name] = round((score - low) * MAX_EXTENDER_PRIORITY / (high - low))
    return result
