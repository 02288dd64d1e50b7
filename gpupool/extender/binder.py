"""Bind one pod: choose its exact cards, record them on the pod, then POST the Binding.

Why this order and these guards (two binds racing for the last space on a card must never both
succeed):

0. The request is checked before anything else: it must name the pod's UID and a node in the
   ledger, and the pod must ask for a resource gpupool manages. Otherwise nothing is written.
1. The cards are chosen *and booked* in the cache's ledger under one lock
   (:meth:`ClusterCache.reserve`), before anything is written. A second bind in this process sees
   the booking and either takes other cards or fails with the core's reason.
2. The assignment annotation is written with the pod's resourceVersion as a precondition. If
   anything changed the pod since we read it (another replica annotating it, a retry of the same
   bind), the API answers 409: the reservation is rolled back, the pod is read again and the
   decision re-evaluated from scratch.
3. Only then is the Binding posted; the API refuses to bind an already-bound pod (409).
4. Any failure rolls the reservation back; success pins it until the watch has caught up.

With several replicas, a :class:`~gpupool.extender.handover.BindFence` admits a bind only on
the leader whose ledger has caught up after it became leader, and is asked again right before the
assignment is written: a replica whose term ended meanwhile rolls back and writes nothing (the
Binding itself may follow a written assignment: the assignment is what books the cards).

When nothing fits any more the bind returns an error: kube-scheduler then puts the pod back in its
queue and schedules it again with fresh filter results.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from gpupool.api.annotations import AnnotationError, Assignment, decode_assignment, encode_assignment
from gpupool.core.model import Placement
from gpupool.core.scheduler import Unschedulable
from gpupool.extender.cache import ClusterCache, now_utc
from gpupool.extender.handover import CATCHING_UP, LOST_DURING_BIND, BindFence, Unfenced
from gpupool.extender.service import BindResult
from gpupool.kube.podapi import ApiError, ConflictError, NoAnswerError, NotFoundError, PodApi
from gpupool.kube.translate import TranslationError, pod_request

log = logging.getLogger(__name__)


class Binder:
    """Binds pods through a :class:`PodApi`, keeping the cache's ledger in step."""

    def __init__(self, cache: ClusterCache, api: PodApi, *, max_attempts: int = 4,
                 clock: Callable[[], dt.datetime] = now_utc, fence: BindFence | None = None) -> None:
        self.cache = cache
        self.api = api
        self.max_attempts = max_attempts
        self.clock = clock
        self.fence: BindFence = fence or Unfenced()

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        """Bind ``namespace/name`` to ``node``; never raises for API or input problems."""
        key = f"{namespace}/{name}"
        ticket = self.fence.admit()
        if ticket is None:
            return BindResult(self.fence.refusal() or CATCHING_UP, attempts=0)
        refusal = self._refusal(key, uid, node)
        if refusal:
            return BindResult(refusal, attempts=0)
        last_conflict = ""
        for attempt in range(1, self.max_attempts + 1):
            # First attempt: the watch's copy saves a GET; if it is stale, the resourceVersion
            # precondition on the patch fails with 409 and the next attempt reads the API.
            cached = self.cache.pod_object(key) if attempt == 1 else None
            try:
                pod = cached if cached is not None else self.api.get_pod(namespace, name)
            except NotFoundError:
                return BindResult(f"pod {key} no longer exists", attempts=attempt)
            except ApiError as exc:
                return BindResult(f"cannot read pod {key}: {exc}", attempts=attempt)
            meta = pod.get("metadata") or {}
            if meta.get("uid") != uid:
                return BindResult(f"pod {key} was replaced (uid {meta.get('uid')}, asked {uid})",
                                  attempts=attempt)
            try:
                request = pod_request(pod, self.cache.names)
            except TranslationError as exc:
                return BindResult(str(exc), attempts=attempt)
            if not request.wants_gpu:
                return BindResult(f"pod {key} asks for no resource gpupool manages; gpupool binds only "
                                  "pods that ask for GPU resources", attempts=attempt)
            bound_to = str((pod.get("spec") or {}).get("nodeName") or "")
            if bound_to:
                return self._already_bound(pod, key, bound_to, node, attempt)
            decision = self.cache.reserve(request, node)
            if isinstance(decision, Unschedulable):
                return BindResult(f"pod {key} does not fit on node {node}: {decision.reason}",
                                  attempts=attempt)
            spec = self.cache.node_spec_of(node)
            if spec is None:  # the node vanished between the decision and now
                self.cache.rollback(key)
                return BindResult(f"node {node} is gone", attempts=attempt)
            assignment = Assignment.from_placement(decision, spec, self.clock())
            if not self.fence.holds(ticket):  # the last moment: after this the booking is public
                self.cache.rollback(key)
                log.warning("bind %s: leadership ended during the bind; nothing written", key)
                return BindResult(LOST_DURING_BIND, attempts=attempt)
            try:
                patched = self.api.patch_pod_annotations(
                    namespace, name, str(meta.get("resourceVersion") or ""),
                    {self.cache.names.assignment: encode_assignment(assignment)})
            except ConflictError as exc:
                self.cache.rollback(key)
                last_conflict = str(exc)
                log.info("bind %s: pod changed while binding (attempt %d), re-evaluating", key, attempt)
                continue
            except NoAnswerError as exc:
                # The write may have been applied (timed out after the server took it): keep the
                # cards booked until the watch shows the annotation or the pin runs out.
                self.cache.commit(key, assignment)
                return BindResult(f"cannot record the assignment on pod {key} (its cards stay booked "
                                  f"until the watch shows whether it was written): {exc}", attempts=attempt)
            except ApiError as exc:
                self.cache.rollback(key)
                return BindResult(f"cannot record the assignment on pod {key}: {exc}", attempts=attempt)
            result = self._post_binding(key, namespace, name, uid, node, decision, assignment, attempt)
            if result.ok:
                return result
            self._clear_annotation(namespace, name, patched)
            if result.error.startswith("conflict:"):
                last_conflict = result.error
                continue
            return result
        return BindResult(f"pod {key}: gave up after {self.max_attempts} conflicting updates "
                          f"({last_conflict})", attempts=self.max_attempts)

    def _refusal(self, key: str, uid: str, node: str) -> str:
        """Why this request is refused before the pod is even read ('' when it is not)."""
        if not uid:
            return (f"bind of pod {key} names no pod UID; gpupool binds only the very pod "
                    "kube-scheduler scheduled")
        if self.cache.node_spec_of(node) is None:
            return f"node {node} is not known to the gpupool extender; it binds only to nodes in its ledger"
        return ""

    def _post_binding(self, key: str, namespace: str, name: str, uid: str, node: str,
                      placement: Placement | None, assignment: Assignment | None, attempt: int) -> BindResult:
        try:
            self.api.bind_pod(namespace, name, uid, node)
        except ConflictError as exc:
            if placement is not None:
                self.cache.rollback(key)
            return BindResult(f"conflict: {exc}", attempts=attempt)
        except ApiError as exc:
            if placement is not None:
                self.cache.rollback(key)
            return BindResult(f"cannot bind pod {key} to {node}: {exc}", attempts=attempt)
        if assignment is not None:
            self.cache.commit(key, assignment)
        return BindResult(placement=placement, attempts=attempt)

    def _already_bound(self, pod: dict[str, Any], key: str, bound_to: str, node: str,
                       attempt: int) -> BindResult:
        """A bind for a pod that is bound already: success if it is where we were asked to put it."""
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        text = annotations.get(self.cache.names.assignment)
        if bound_to != node:
            return BindResult(f"pod {key} is already bound to node {bound_to}", attempts=attempt)
        if text is not None:
            try:
                if decode_assignment(text).node != node:
                    return BindResult(f"pod {key} is bound to {node} but its assignment names another node",
                                      attempts=attempt)
            except AnnotationError as exc:
                return BindResult(f"pod {key}: {exc}", attempts=attempt)
        self.cache.upsert_pod(pod)  # adopt the other writer's booking now rather than at the next event
        return BindResult(attempts=attempt)

    def _clear_annotation(self, namespace: str, name: str, patched: dict[str, Any]) -> None:
        """Best effort: remove an assignment whose Binding failed (the expiry covers a failure here)."""
        rv = str((patched.get("metadata") or {}).get("resourceVersion") or "")
        try:
            self.api.patch_pod_annotations(namespace, name, rv, {self.cache.names.assignment: None})
        except ApiError as exc:
            log.info("could not clear the assignment of %s/%s: %s", namespace, name, exc)
