"""Who may borrow lent capacity, and which waiting pod gets a loan first.

A pod is placed on lent capacity (:mod:`gpupool.core.lent`) only when all of these hold:

* it fits no free (owned) capacity among the nodes kube-scheduler proposed: free capacity is
  always preferred, and a pod placed there is never reclaimed;
* its priority reads low (:func:`gpupool.api.lending.pod_priority`: ``gpupool.io/priority``, else
  its PriorityClass against the threshold): a borrower is low priority by definition, and a
  high-priority pod would lose its card the moment the owner returns;
* it is willing: ``gpupool.io/borrow: "true"``, or no annotation and a controller owns it.
  ``"false"`` (or any other value) opts out. Why a controller by default: a borrower is evicted
  when the owner returns; a Deployment's, Job's or StatefulSet's pod is then replaced and waits
  again, while a bare pod would end evicted, lost to the user who never asked to borrow;
* no older waiting pod wants the same loan (claim 5, the earliest request wins): a pod that was
  refused owned capacity on a node and could borrow there is remembered for
  :data:`WAIT_MEMORY_S`; while it is still pending and its request fits the node's loan, a younger
  pod is refused that node with the older pod's name. Only nodes the older pod's own filter
  proposed and admitted count, so a pod that can never run there (selectors, taints, its group)
  blocks nobody. Age is ``metadata.creationTimestamp`` (then the name).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from gpupool.api.lending import DEFAULT_HIGH_PRIORITY_THRESHOLD, LendingNames, borrow_refusal
from gpupool.core.fragmentation import FloatArray, WorkloadProfile
from gpupool.core.lent_view import PolicyFactory, lent_assign, lent_fit, lent_view
from gpupool.core.model import Placement, PodRequest
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.kube.pod_holding import PodRecord

WAIT_MEMORY_S = 300.0
"""How long a pod refused owned capacity is remembered as waiting for a loan. kube-scheduler 1.20
retries an unschedulable pod at least every 60 s, so a pod still waiting is seen again well within
this; one that stopped being retried (deleted, scheduled elsewhere) is forgotten."""

NO_ROWS: IntArray = np.zeros(0, dtype=np.int64)
OLDER_CHECKED = 64
"""Older waiting pods a loan is checked against, oldest first: bounds a filter's cost when many
pods wait (the oldest are the ones the rule serves first)."""


@dataclass(frozen=True)
class BorrowSettings:
    """The extender's lending switches (the CLI exposes them)."""

    enabled: bool = True
    """Place borrowers on the cards nodes publish as lendable (nodes lend only with the agent's
    ``--lending``)."""
    threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD
    """``spec.priority`` at or above which a pod is high priority (the agents' threshold)."""


class FilterOutcome(StrEnum):
    """How a filter's question to lent capacity ended (the ``outcome`` label of
    ``gpupool_extender_lending_filters``)."""

    PASSED = "passed"
    """At least one node may take the pod on a loan."""
    HELD_FOR_EARLIER = "held_for_earlier"
    """Loans fit the pod, but every one is held for an older waiting pod (claim 5)."""
    NO_LOAN_FITS = "no_loan_fits"
    NOT_A_BORROWER = "not_a_borrower"
    """The pod may not borrow (priority, opt-out, no controller, lending off)."""


@dataclass(frozen=True)
class Waiting:
    """A pod that found no owned capacity and may borrow: its age and the ledger rows of the nodes
    its filter admitted (a mask over the rows then known; rows keep their node's name for good)."""

    key: str
    uid: str
    created: float
    admitted: BoolArray
    seen: float

    def order(self) -> tuple[float, str]:
        return self.created, self.key

    def admits(self, rows: IntArray) -> BoolArray:
        """Which of ``rows`` this pod's filter admitted."""
        known = rows < len(self.admitted)
        found: BoolArray = np.zeros(len(rows), dtype=bool)
        found[known] = self.admitted[rows[known]]
        return found


@dataclass
class Lending:
    """The borrower rules over the cache's pod records (read under the cache's lock)."""

    pods: Mapping[str, PodRecord]
    names: LendingNames
    settings: BorrowSettings = field(default_factory=BorrowSettings)
    clock: Callable[[], float] = time.time
    waiting: dict[str, Waiting] = field(default_factory=dict)
    filters: Counter[FilterOutcome] = field(default_factory=Counter)
    """Filter answers that asked lent capacity, by outcome (exported as metrics; read under the lock)."""
    placed: int = 0
    """Binds that booked a pod on lent capacity (counted by the cache when the booking is made; a
    bind whose API write then fails counts too)."""

    def refusal(self, key: str, asked: PodRequest | None = None, pod: Mapping[str, Any] | None = None) -> str | None:
        """Why pod ``key`` may not borrow (None when it may), from its watched object, or else from
        the object the filter was asked about (``pod``, translated as ``asked``): kube-scheduler can
        ask before the extender's watch delivers a new pod, and refusing then would cost the pod a
        retry with back-off."""
        if not self.settings.enabled:
            return "lending is off in this extender"
        record = self.pods.get(key)
        if record is not None and record.raw is not None and record.request is not None:
            raw, priority = record.raw, record.request.priority
        elif pod is not None and asked is not None:
            raw, priority = pod, asked.priority
        else:
            return "the extender has not seen the pod yet (it may borrow on a later try)"
        return borrow_refusal(raw.get("metadata") or {}, priority, threshold=self.settings.threshold,
                              names=self.names, spec=raw.get("spec"))

    def place(self, state: ClusterState, request: PodRequest, rows: IntArray, policy: PolicyFactory,
              profile: WorkloadProfile | None, explain_limit: int,
              pod: Mapping[str, Any] | None = None) -> tuple[IntArray, FloatArray, dict[int, str]]:
        """The filter's second step, for a pod that fits no owned capacity on ``rows`` (the nodes
        admitted for it): the rows whose loans can hold it, less those held for an older request,
        their scores, and per row a note for the node's refusal. ``pod``: the object the filter
        was asked about (read when the watch has not delivered the pod yet)."""
        refused = self.refusal(request.key, request, pod)
        if refused is not None:
            self.filters[FilterOutcome.NOT_A_BORROWER] += 1
            return NO_ROWS, np.zeros(0), dict.fromkeys(rows[:explain_limit].tolist(), f"; not a borrower: {refused}")
        self._forget_gone()
        admitted: BoolArray = np.zeros(state.size, dtype=bool)
        admitted[rows] = True
        me = self._me(request.key, admitted)
        self.waiting[request.key] = me
        found = lent_fit(state, request, rows, policy(), profile, explain_limit)
        notes = {row: f"; {why}" for row, why in found.reasons.items()}
        held = self._held(state, me, found.rows, policy, profile)
        keep = np.array([row not in held for row in found.rows.tolist()], dtype=bool)
        self.filters[FilterOutcome.PASSED if keep.any() else FilterOutcome.HELD_FOR_EARLIER if len(keep)
                     else FilterOutcome.NO_LOAN_FITS] += 1
        if not held:
            return found.rows, found.scores, notes
        return found.rows[keep], found.scores[keep], {**notes, **{row: f"; {why}" for row, why in held.items()}}

    def assign(self, state: ClusterState, request: PodRequest, node: str, policy: PolicyFactory,
               profile: WorkloadProfile | None) -> Placement | Unschedulable:
        """The bind's choice on ``node``'s loans, under the same rules as :meth:`place`."""
        refused = self.refusal(request.key)
        if refused is not None:
            return Unschedulable(request.key, f"no free capacity, and it may not borrow: {refused}")
        row = state.index.get(node)
        self._forget_gone()
        if row is not None:
            admitted: BoolArray = np.zeros(state.size, dtype=bool)
            admitted[row] = True
            held = self._held(state, self._me(request.key, admitted), np.array([row], dtype=np.int64), policy,
                              profile)
            if held:
                return Unschedulable(request.key, held[row])
        decision = lent_assign(state, request, node, policy(), profile)
        if isinstance(decision, Placement):
            self.waiting.pop(request.key, None)
        return decision

    def _me(self, key: str, admitted: BoolArray) -> Waiting:
        """Pod ``key`` as a waiting pod now (its first-seen age kept when it has no timestamp)."""
        record = self.pods.get(key)
        uid = record.uid if record is not None else ""
        known = self.waiting.get(key)
        created = known.created if known is not None and known.uid == uid else self._created(record)
        return Waiting(key, uid, created, admitted, self.clock())

    def _held(self, state: ClusterState, me: Waiting, rows: IntArray, policy: PolicyFactory,
              profile: WorkloadProfile | None) -> dict[int, str]:
        """Of ``rows`` (lending rows that fit ``me``), those whose loan an older waiting pod admitted
        there fits now, each with that pod's name in words (the oldest such pod)."""
        if not len(rows):
            return {}
        older = self._older(me)[:OLDER_CHECKED]
        if not older:
            return {}
        seen = lent_view(state, rows)
        scheduler = Scheduler(seen.view, policy(), profile=profile, cache=False)
        held: dict[int, str] = {}
        for other in older:
            record = self.pods.get(other.key)
            if record is None or record.request is None or self.refusal(other.key) is not None:
                continue
            open_rows = np.flatnonzero(other.admits(seen.real_rows) & ~np.isin(seen.real_rows, list(held)))
            if not len(open_rows):
                continue
            fits, _ = scheduler.filter_and_score(record.request, open_rows.astype(np.int64))
            for row in seen.real(fits).tolist():
                held[row] = (f"its lent capacity is held for the earlier request {other.key} (the earliest "
                             "waiting pod borrows first)")
            if len(held) == len(seen.real_rows):
                break
        return held

    def _forget_gone(self) -> None:
        """Forget the waiting pods that no longer wait (bound, ended, replaced, not seen for long)."""
        now = self.clock()
        for key in [k for k, w in self.waiting.items() if not self._pending(w, now)]:
            del self.waiting[key]

    def _older(self, me: Waiting) -> list[Waiting]:
        """The waiting pods older than ``me``, oldest first."""
        return sorted((w for w in self.waiting.values() if w.order() < me.order()), key=Waiting.order)

    def _pending(self, waiting: Waiting, now: float) -> bool:
        record = self.pods.get(waiting.key)
        return (now - waiting.seen <= WAIT_MEMORY_S and record is not None and record.uid == waiting.uid
                and not record.node_name and not record.finished)

    def _created(self, record: PodRecord | None) -> float:
        stamp = ((record.raw or {}).get("metadata") or {}).get("creationTimestamp") if record else None
        try:
            return dt.datetime.fromisoformat(str(stamp)).timestamp() if stamp else self.clock()
        except ValueError:
            return math.inf

