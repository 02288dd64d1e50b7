"""Bind one pod: choose its exact cards, record them on the pod, then POST the Binding.

Why this order and these guards (two binds racing for the last space on a card must never both
succeed):

1. The request is checked before anything else: it must name the pod's UID and a node in the
   ledger, and the pod must ask for a resource gpupool manages. Otherwise nothing is written,
   except for a pod whose GPUs come from DRA ResourceClaims only (gpupool's scheduler asks the
   extender about those too, docs/dra.md): it gets a plain Binding, its claims book its cards.
2. Binds of one pod run one at a time (:class:`~gpupool.extender.bind_flights.PodFlights`):
   kube-scheduler sends a bind again once the first passed its timeout, and two binds of one pod
   interleaved would each lift the other's reservation. A repeat of the running bind (same UID,
   same node) gets its answer; any other waits and then starts from what the first left.
3. The cards are chosen *and booked* in the cache's ledger under one lock
   (:meth:`ClusterCache.reserve`), before anything is written. A second bind in this process sees
   the booking and either takes other cards or fails with the core's reason.
4. One write records the cards and binds: the Binding carries the assignment annotation, which
   the apiserver merges into the pod in the same write that sets its node, and refuses (409) for
   a pod that is bound already. So a pod is never bound without its assignment, nor annotated
   without being bound, and of two writers of one pod (another replica, a retry of the same bind)
   exactly one succeeds; the other's reservation is rolled back, the pod is read again and the
   decision re-evaluated from scratch. The Binding also names the pod's uid and the
   resourceVersion read, preconditions that apiservers from v1.23 check (409 for a pod replaced
   or changed since); v1.20-v1.22 ignore them and bind whichever pod has the name. So the
   assignment also names the pod's uid (``podUID``): the node agent refuses to grant it to any
   other pod, and the cache treats a pod carrying another pod's assignment as unreadable (see
   docs/extender.md, "Bind").
5. ``annotate_in_binding=False`` keeps the two writes for apiservers that drop a Binding's
   annotations: the annotation is PATCHed with the resourceVersion as a precondition (409 when the
   pod changed since it was read), and only then is the Binding posted.
6. Any failure rolls the reservation back; success pins it until the watch has caught up. A write
   without an answer (timeout), or answered with a server error after which it may still have been
   applied (:func:`~gpupool.kube.podapi.may_have_applied`: 500, 502, 504), keeps its cards booked
   instead. A later bind of the pod never lifts those cards to decide afresh
   (:meth:`ClusterCache.reserve`): it takes the same ones, or is refused on another node.
7. A bind has a deadline across its attempts: the apiserver can stall each call for its whole
   timeout, and a bind that runs on would hold a bind thread and its pod's later binds.

With several replicas, a :class:`~gpupool.extender.handover.BindFence` admits a bind only on
the leader whose ledger has caught up after it became leader, and is asked again right before the
assignment is written: a replica whose term ended meanwhile rolls back and writes nothing (the
Binding itself may follow a written assignment: the assignment is what books the cards).

When nothing fits any more the bind returns an error: kube-scheduler then puts the pod back in its
queue and schedules it again with fresh filter results.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpupool.api.annotations import (
    AnnotationError,
    Assignment,
    decode_assignment,
    encode_assignment,
    foreign_assignment,
)
from gpupool.api.remote_share import RemoteShare, encode_remote_share
from gpupool.core.model import Placement
from gpupool.core.scheduler import Unschedulable
from gpupool.extender.bind_flights import PodFlights
from gpupool.extender.booking_keeper import PinnedElsewhere, SeenBound
from gpupool.extender.cache import ClusterCache, now_utc
from gpupool.extender.handover import CATCHING_UP, LOST_DURING_BIND, BindFence, Unfenced
from gpupool.extender.lendable import LendingNames, binding_marks
from gpupool.extender.service import BindResult
from gpupool.kube.claim_asks import has_claims
from gpupool.kube.podapi import ApiError, ConflictError, NotFoundError, PodApi, may_have_applied
from gpupool.kube.tenancy import pod_tenancy
from gpupool.kube.translate import TranslationError

log = logging.getLogger(__name__)

DEFAULT_DEADLINE_S = 8.0

#: The least time a pod read is given, even when the deadline is about to pass.
MIN_READ_TIMEOUT_S = 0.05
"""A bind's total time across its attempts. Below the 10 s ``httpTimeout`` that deploy/ gives
kube-scheduler for the extender, so that kube-scheduler gets the answer (an error included) before
it gives up on the bind and sends it again."""


@dataclass(frozen=True)
class Deadline:
    """The moment (on ``timer``) by which a bind must have finished its work, ``seconds`` after it began."""

    at: float
    seconds: float
    timer: Callable[[], float]

    @classmethod
    def start(cls, seconds: float, timer: Callable[[], float]) -> Deadline:
        return cls(timer() + seconds, seconds, timer)

    def left(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - self.timer()

    def passed(self) -> bool:
        return self.left() <= 0


@dataclass(frozen=True)
class _Ask:
    """One bind request, as the binder's steps need it."""

    key: str
    namespace: str
    name: str
    uid: str
    node: str


class Binder:
    """Binds pods through a :class:`PodApi`, keeping the cache's ledger in step."""

    def __init__(self, cache: ClusterCache, api: PodApi, *, max_attempts: int = 4,
                 deadline_s: float = DEFAULT_DEADLINE_S, clock: Callable[[], dt.datetime] = now_utc,
                 timer: Callable[[], float] = time.monotonic, fence: BindFence | None = None,
                 annotate_in_binding: bool = True) -> None:
        self.cache = cache
        self.annotate_in_binding = annotate_in_binding
        self.api = api
        self.max_attempts = max_attempts
        self.deadline_s = deadline_s
        self.clock = clock
        self.timer = timer
        self.fence: BindFence = fence or Unfenced()
        self._flights: PodFlights[BindResult] = PodFlights()

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        """Bind ``namespace/name`` to ``node``; never raises for API or input problems."""
        ask = _Ask(f"{namespace}/{name}", namespace, name, uid, node)
        ticket = self.fence.admit()
        if ticket is None:
            return BindResult(self.fence.refusal() or CATCHING_UP, attempts=0)
        refusal = self._refusal(ask)
        if refusal:
            return BindResult(refusal, attempts=0)
        deadline = Deadline.start(self.deadline_s, self.timer)
        outcome = self._flights.run(ask.key, (uid, node), deadline.left,
                                    lambda: self._attempts(ask, ticket, deadline))
        if outcome.result is None:
            return BindResult(f"pod {ask.key}: an earlier bind of this pod is still in progress after "
                              f"this bind's {deadline.seconds:g} s deadline; nothing was done, retry later",
                              attempts=0)
        if outcome.shared:  # the answer of the same bind, sent earlier and still running then
            return dataclasses.replace(outcome.result, attempts=0)
        return outcome.result

    def _refusal(self, ask: _Ask) -> str:
        """Why this request is refused before the pod is even read ('' when it is not)."""
        if not ask.uid:
            return (f"bind of pod {ask.key} names no pod UID; gpupool binds only the very pod "
                    "kube-scheduler scheduled")
        if self.cache.node_spec_of(ask.node) is None:
            return f"node {ask.node} is not known to the gpupool extender; it binds only to nodes in its ledger"
        return ""

    @staticmethod
    def _late(ask: _Ask, deadline: Deadline, when: str, attempt: int) -> BindResult:
        return BindResult(f"pod {ask.key}: the bind ran past its {deadline.seconds:g} s deadline {when}; "
                          "its reservation is released and kube-scheduler may retry", attempts=attempt)

    def _attempts(self, ask: _Ask, ticket: int, deadline: Deadline) -> BindResult:
        """Bind, reading the pod again after each conflict, until done, refused, or out of time."""
        key = ask.key
        last_conflict = ""
        for attempt in range(1, self.max_attempts + 1):
            if deadline.passed():
                return self._late(ask, deadline, f"before attempt {attempt}", attempt)
            # First attempt: the watch's copy saves a GET. A stale copy gets a 409 from the write
            # (the PATCH's precondition; the Binding's from v1.23, or because the pod is bound) and
            # the next attempt reads the API.
            cached = self.cache.pod_object(key) if attempt == 1 else None
            try:
                # The read gets what is left of the deadline, not the client's whole timeout: an
                # apiserver that stalls it must not make the bind answer after kube-scheduler gave up.
                pod = cached if cached is not None else self.api.get_pod(
                    ask.namespace, ask.name, timeout_s=max(deadline.left(), MIN_READ_TIMEOUT_S))
            except NotFoundError:
                return BindResult(f"pod {key} no longer exists", attempts=attempt)
            except ApiError as exc:
                return BindResult(f"cannot read pod {key}: {exc}", attempts=attempt)
            if deadline.passed():
                return self._late(ask, deadline, "while the pod was read", attempt)
            meta = pod.get("metadata") or {}
            if meta.get("uid") != ask.uid:
                return BindResult(f"pod {key} was replaced (uid {meta.get('uid')}, asked {ask.uid})",
                                  attempts=attempt)
            try:
                request = self.cache.requests.request(pod)  # the watch has usually translated it
                tenant = pod_tenancy(pod, self.cache.tenancy.names)
            except TranslationError as exc:
                return BindResult(str(exc), attempts=attempt)
            if not request.wants_gpu and has_claims(pod):
                try:
                    return self._bind_claim_pod(ask, pod, ticket, attempt)
                except ConflictError as exc:
                    last_conflict = str(exc)
                    continue
            if not request.wants_gpu:
                return BindResult(f"pod {key} asks for no resource gpupool manages; gpupool binds only "
                                  "pods that ask for GPU resources or name ResourceClaims", attempts=attempt)
            bound_to = str((pod.get("spec") or {}).get("nodeName") or "")
            if bound_to:
                return self._already_bound(pod, key, bound_to, ask.node, attempt)
            decision = self.cache.reserve(request, ask.node, tenant, uid=ask.uid)
            if isinstance(decision, SeenBound | PinnedElsewhere):
                # The pod is bound, or an earlier bind's write may have bound it: the API says which
                # (a bound pod is answered as such); a pod it shows unbound waits for that write.
                if cached is not None:
                    last_conflict = decision.reason
                    continue
                return BindResult(decision.reason, attempts=attempt)
            if isinstance(decision, Unschedulable):
                return BindResult(f"pod {key} does not fit on node {ask.node}: {decision.reason}",
                                  attempts=attempt)
            spec = self.cache.node_spec_of(decision.node)  # a remote share's server node, else ask.node
            if spec is None:  # the node vanished between the decision and now
                self.cache.rollback(key)
                return BindResult(f"node {ask.node} is gone", attempts=attempt)
            # The pod's uid goes into the assignment: v1.20-v1.22 bind by name alone, and a pod
            # replaced under that name before the Binding must not be granted these cards.
            assignment = Assignment.from_placement(decision, spec, self.clock(), pod_uid=ask.uid)
            if not self.fence.holds(ticket):  # the last moment: after this the booking is public
                self.cache.rollback(key)
                log.warning("bind %s: leadership ended during the bind; nothing written", key)
                return BindResult(LOST_DURING_BIND, attempts=attempt)
            if self.annotate_in_binding:
                try:
                    return self._bind_with_assignment(ask, decision, assignment, meta, attempt)
                except ConflictError as exc:
                    last_conflict = str(exc)
                    log.info("bind %s: pod bound or changed meanwhile (attempt %d), re-evaluating", key, attempt)
                    continue
            try:
                patched = self.api.patch_pod_annotations(
                    ask.namespace, ask.name, str(meta.get("resourceVersion") or ""),
                    dict[str, str | None](self._annotations(ask, decision, assignment, meta)))
            except ConflictError as exc:
                self.cache.rollback(key)
                last_conflict = str(exc)
                log.info("bind %s: pod changed while binding (attempt %d), re-evaluating", key, attempt)
                continue
            except ApiError as exc:
                if may_have_applied(exc):
                    # The write may have been applied (no answer, or a server error after the
                    # server took it): keep the cards booked until the watch shows the annotation
                    # or the pin runs out.
                    self.cache.commit(key, assignment, ask.node)
                    return BindResult(f"cannot record the assignment on pod {key} (its cards stay booked "
                                      f"until the watch shows whether it was written): {exc}", attempts=attempt)
                self.cache.rollback(key)
                return BindResult(f"cannot record the assignment on pod {key}: {exc}", attempts=attempt)
            if deadline.passed():
                self._undo(ask, patched)
                return self._late(ask, deadline, "while its assignment was written (the assignment is "
                                  "removed again)", attempt)
            try:
                return self._post_binding(ask, decision, assignment, patched, attempt)
            except ConflictError as exc:
                last_conflict = str(exc)
        return BindResult(f"pod {key}: gave up after {self.max_attempts} conflicting updates "
                          f"({last_conflict})", attempts=self.max_attempts)

    def _bind_claim_pod(self, ask: _Ask, pod: dict[str, Any], ticket: int, attempt: int) -> BindResult:
        """Bind a pod whose GPUs come from ResourceClaims only: a plain Binding, no assignment. Its
        claims' allocation (written by kube-scheduler's DRA PreBind, before this bind) is what books
        the cards, in the ledger from the claim watch (:mod:`gpupool.extender.dra_bookings`) and on
        the node at prepare. A 409 is raised again for the caller to read the pod anew."""
        bound_to = str((pod.get("spec") or {}).get("nodeName") or "")
        if bound_to:
            error = "" if bound_to == ask.node else f"pod {ask.key} is already bound to node {bound_to}"
            return BindResult(error, attempts=attempt)
        if not self.fence.holds(ticket):
            return BindResult(LOST_DURING_BIND, attempts=attempt)
        try:
            self.api.bind_pod(ask.namespace, ask.name, ask.uid, ask.node,
                              resource_version=str((pod.get("metadata") or {}).get("resourceVersion") or ""))
        except NotFoundError:
            return BindResult(f"pod {ask.key} no longer exists", attempts=attempt)
        except ConflictError:
            raise
        except ApiError as exc:  # a timeout included: nothing of gpupool's is booked either way
            return BindResult(f"cannot bind pod {ask.key} to {ask.node}: {exc}", attempts=attempt)
        return BindResult(attempts=attempt)

    def _bind_with_assignment(self, ask: _Ask, placement: Placement, assignment: Assignment,
                              meta: dict[str, Any], attempt: int) -> BindResult:
        """POST the Binding that carries the assignment; a 409 is rolled back and raised again."""
        try:
            self.api.bind_pod(ask.namespace, ask.name, ask.uid, ask.node,
                              annotations=self._annotations(ask, placement, assignment, meta),
                              resource_version=str(meta.get("resourceVersion") or ""))
        except ConflictError:
            self.cache.rollback(ask.key)
            raise
        except NotFoundError:
            self.cache.rollback(ask.key)
            return BindResult(f"pod {ask.key} no longer exists", attempts=attempt)
        except ApiError as exc:
            if may_have_applied(exc):
                # The pod may be bound with its assignment now (no answer, or a server error such
                # as etcd's time-out after the write was proposed): keep the cards booked until the
                # watch shows whether it was (or the pin runs out). Rolled back, they went to the
                # next bind while the pod held them (tests/extender/test_bind_interleavings.py).
                self.cache.commit(ask.key, assignment, ask.node)
                return BindResult(f"cannot bind pod {ask.key} to {ask.node} (its cards stay booked until the "
                                  f"watch shows whether it was bound): {exc}", attempts=attempt)
            self.cache.rollback(ask.key)
            return BindResult(f"cannot bind pod {ask.key} to {ask.node}: {exc}", attempts=attempt)
        self.cache.commit(ask.key, assignment, ask.node)  # bound: a success even past the deadline
        return BindResult(placement=placement, attempts=attempt)

    def _annotations(self, ask: _Ask, placement: Placement, assignment: Assignment,
                     meta: dict[str, Any]) -> dict[str, str]:
        """What the bind writes on the pod: the assignment (``remote-share-v1`` for a share booked on
        another node than ``ask.node``, :mod:`gpupool.api.remote_share`), and a borrower's marks
        (:func:`gpupool.extender.lendable.binding_marks`)."""
        names = self.cache.names
        written = ({names.remote_share: encode_remote_share(RemoteShare.from_assignment(assignment))}
                   if assignment.node != ask.node else {names.assignment: encode_assignment(assignment)})
        return {**written,
                **binding_marks(placement, meta.get("annotations") or {}, LendingNames(self.cache.names.domain))}

    def _post_binding(self, ask: _Ask, placement: Placement, assignment: Assignment,
                      patched: dict[str, Any], attempt: int) -> BindResult:
        """POST the Binding of a pod whose assignment is written; a 409 is undone and raised again."""
        try:
            self.api.bind_pod(ask.namespace, ask.name, ask.uid, ask.node)
        except ConflictError:
            self._undo(ask, patched)
            raise
        except ApiError as exc:
            if may_have_applied(exc):
                # The pod may be bound now: freeing its cards before the watch says would let the
                # next bind give them away a second time.
                self.cache.commit(ask.key, assignment, ask.node)
                return BindResult(f"cannot bind pod {ask.key} to {ask.node} (its cards stay booked until the "
                                  f"watch shows whether it was bound): {exc}", attempts=attempt)
            self._undo(ask, patched)
            return BindResult(f"cannot bind pod {ask.key} to {ask.node}: {exc}", attempts=attempt)
        self.cache.commit(ask.key, assignment, ask.node)
        return BindResult(placement=placement, attempts=attempt)

    def _undo(self, ask: _Ask, patched: dict[str, Any]) -> None:
        """Give the reservation back and remove the assignment just written (it will not be bound)."""
        self.cache.rollback(ask.key)
        self._clear_annotation(ask.namespace, ask.name, patched)

    def _already_bound(self, pod: dict[str, Any], key: str, bound_to: str, node: str,
                       attempt: int) -> BindResult:
        """A bind for a pod that is bound already: success if it is where we were asked to put it."""
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        text = annotations.get(self.cache.names.assignment)
        if bound_to != node:
            return BindResult(f"pod {key} is already bound to node {bound_to}", attempts=attempt)
        if text is not None:
            try:
                assignment = decode_assignment(text)
            except AnnotationError as exc:
                return BindResult(f"pod {key}: {exc}", attempts=attempt)
            if assignment.node != node:
                return BindResult(f"pod {key} is bound to {node} but its assignment names another node",
                                  attempts=attempt)
            foreign = foreign_assignment(assignment.pod_uid, str((pod.get("metadata") or {}).get("uid") or ""))
            if foreign is not None:
                return BindResult(f"pod {key}: {foreign}", attempts=attempt)
        self.cache.upsert_pod(pod)  # adopt the other writer's booking now rather than at the next event
        return BindResult(attempts=attempt)

    def _clear_annotation(self, namespace: str, name: str, patched: dict[str, Any]) -> None:
        """Best effort: remove an assignment whose Binding failed (the expiry covers a failure here)."""
        rv = str((patched.get("metadata") or {}).get("resourceVersion") or "")
        try:
            lending = LendingNames(self.cache.names.domain)
            self.api.patch_pod_annotations(namespace, name, rv, {self.cache.names.assignment: None,
                                                                 self.cache.names.remote_share: None,
                                                                 lending.borrowed: None, lending.borrowed_from: None})
        except ApiError as exc:
            log.info("could not clear the assignment of %s/%s: %s", namespace, name, exc)
