"""The extender's in-memory view of the cluster: nodes, GPU pods, and the core ledger built from them.

Why a separate cache (not a read of the API per request): filter and prioritize must answer for
thousands of nodes within milliseconds, so they read a :class:`ClusterState` that is kept current by
list+watch events (:mod:`gpupool.extender.watch`) and by the binder's own reservations.

The ledger holds GPUs only. CPU and memory are kube-scheduler's business (it filters them before the
extender is asked), so bookings carry no CPU or memory; the pods' CPU still shapes the policy's score.

What is booked for a pod (recomputed on every event, so the ledger always equals this rule applied to
the latest objects):

1. a bind in flight (:meth:`reserve`): its placement, whatever the watch says meanwhile;
2. a bind that just succeeded (:meth:`commit`): its placement, *pinned* until the watch delivers the
   pod with that same assignment, so that an older event still in the stream cannot free it;
3. otherwise the pod's ``assignment-v1`` annotation, if the pod is not finished and either bound to
   that node, confirmed by the node (``allocated-v1``), or younger than the unconfirmed timeout.
   An annotated pod that was never bound expires after the timeout: its bind did not complete.

Thread safety: every public method takes :attr:`lock`; callers that read ``state`` for several steps
(filter, prioritize, bind) hold it themselves.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.annotations import (
    AnnotationError,
    Assignment,
    decode_allocated,
    decode_assignment,
)
from gpupool.api.names import ALIASES, ResourceNames
from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import NodeSpec, Placement, PodRequest
from gpupool.core.policies import DEFAULT_POLICY, make_policy
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import AllocationError, ClusterState
from gpupool.kube.translate import (
    TranslationError,
    as_dict,
    node_spec,
    pod_key,
    pod_request,
    pod_wants_gpu,
)

log = logging.getLogger(__name__)

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
PIN_SECONDS = 120.0
"""How long a committed bind is held against a watch that has not yet shown its annotation."""


@dataclass
class PodRecord:
    """What the cache keeps of one GPU pod (pods without GPUs and without assignments are not kept)."""

    key: str
    uid: str
    node_name: str
    finished: bool
    request: PodRequest | None
    assignment: Assignment | None
    allocated: bool
    problem: str | None = None
    raw: Mapping[str, Any] | None = None


@dataclass
class _Pin:
    placement: Placement
    assignment: Assignment
    deadline: float


def strip_host_resources(placement: Placement) -> Placement:
    """The placement as the GPU-only ledger books it (CPU and memory are kube-scheduler's)."""
    return dataclasses.replace(placement, cpu_milli=0, memory_mib=0)


class ClusterCache:
    """Nodes and GPU pods from the API, folded into one :class:`ClusterState` and a :class:`Scheduler`."""

    def __init__(self, names: ResourceNames | None = None, *, policy: str = DEFAULT_POLICY,
                 unconfirmed_timeout_s: float = 300.0, clock: Callable[[], float] = time.time) -> None:
        self.names = names or ResourceNames()
        self.policy_name = policy
        self.unconfirmed_timeout_s = unconfirmed_timeout_s
        self.clock = clock
        self.lock = threading.RLock()
        self.state = ClusterState()
        make_policy(policy)  # fail fast on an unknown name
        self.scheduler = Scheduler(self.state, make_policy(policy))
        self.pods: dict[str, PodRecord] = {}
        self.uids: dict[str, str] = {}
        self.node_problems: dict[str, str] = {}
        self.served_aliases: dict[str, frozenset[str]] = {}
        self.served_aliases_version = 0
        self.conflicts: dict[str, str] = {}
        self._waiting_on_node: dict[str, set[str]] = {}
        self._inflight: dict[str, Placement] = {}
        self._pins: dict[str, _Pin] = {}
        self._node_memo: dict[str, tuple[str, NodeSpec]] = {}
        self.nodes_synced = False
        self.pods_synced = False

    # ------------------------------------------------------------------------------ readiness
    @property
    def synced(self) -> bool:
        """True once one full list of nodes and of pods has been applied."""
        return self.nodes_synced and self.pods_synced

    def refresh_profile(self) -> None:
        """Rebuild the scheduler with the workload profile of the pods known now.

        Fragmentation-aware policies score against the workload the cluster actually runs; the
        profile changes slowly, so this is called after sync and then every few minutes.
        """
        with self.lock:
            requests = [r.request for r in self.pods.values() if r.request is not None]
            profile = WorkloadProfile.from_pods(requests) if requests else None
            self.scheduler = Scheduler(self.state, make_policy(self.policy_name), profile=profile)

    # ---------------------------------------------------------------------------------- nodes
    def upsert_node(self, node: Mapping[str, Any] | Any) -> None:
        """Apply an ADDED/MODIFIED node; a node with a broken inventory keeps no cards, with a reason."""
        raw = as_dict(node)
        with self.lock:
            try:
                spec = self._spec_for(raw)
                self.node_problems.pop(spec.name, None)
            except TranslationError as exc:
                name = str(((raw.get("metadata") or {}).get("name")) or "")
                if not name:
                    log.warning("ignoring node without a name: %s", exc)
                    return
                spec = NodeSpec(name=name, cpu_milli=0, memory_mib=0)
                self.node_problems[name] = str(exc)
                log.warning("%s", exc)
            served = served_aliases(raw)
            if self.served_aliases.get(spec.name) != served:
                self.served_aliases[spec.name] = served
                self.served_aliases_version += 1
            old = self.state.index.get(spec.name)
            if old is not None and self.state.present[old] and self.state.specs[old] == spec:
                return  # heartbeats change status fields we do not read
            self.state.upsert_node(spec)
            for key in list(self._waiting_on_node.get(spec.name, ())):
                self._reconcile(key)

    def _spec_for(self, raw: Mapping[str, Any]) -> NodeSpec:
        """The node's spec, translated again only when a field it depends on changed.

        Node status heartbeats arrive every few seconds per node; re-validating the inventory JSON of
        5,000 nodes on each would cost more than all the scheduling work.
        """
        meta = raw.get("metadata") or {}
        status = raw.get("status") or {}
        name = str(meta.get("name") or "")
        inventory = (meta.get("annotations") or {}).get(self.names.inventory)
        fingerprint = json.dumps([inventory, meta.get("labels"), status.get("capacity"),
                                  status.get("allocatable")], sort_keys=True)
        memo = self._node_memo.get(name)
        if memo is not None and memo[0] == fingerprint:
            return memo[1]
        spec = node_spec(raw, self.names)
        self._node_memo[name] = (fingerprint, spec)
        return spec

    def _add_new_nodes(self, raws: list[dict[str, Any]]) -> None:
        """Add the nodes of a list that the ledger does not know yet, with one allocation.

        A first list (or a re-list that brings many new nodes) would otherwise grow the ledger one
        node at a time. Nodes whose description is broken are left to :meth:`upsert_node`, which
        records the reason.
        """
        specs: list[NodeSpec] = []
        for raw in raws:
            name = str((raw.get("metadata") or {}).get("name") or "")
            if not name or name in self.state.index:
                continue
            try:
                specs.append(self._spec_for(raw))
            except TranslationError:
                continue
        if not specs:
            return
        self.state.add_nodes(specs)
        for spec in specs:  # pods whose assignment names a node that was not there yet
            self.node_problems.pop(spec.name, None)
            for key in list(self._waiting_on_node.get(spec.name, ())):
                self._reconcile(key)

    def remove_node(self, name: str) -> None:
        """Apply a DELETED node; its bookings go with it and come back if the node does."""
        with self.lock:
            self.state.remove_node(name)
            self.node_problems.pop(name, None)
            if self.served_aliases.pop(name, None) is not None:
                self.served_aliases_version += 1
            self._node_memo.pop(name, None)

    def replace_nodes(self, nodes: Iterable[Mapping[str, Any] | Any]) -> None:
        """Apply a full list (start, or re-list after 410 Gone): upsert all, remove the rest."""
        with self.lock:
            raws = [as_dict(node) for node in nodes]
            self._add_new_nodes(raws)
            seen: set[str] = set()
            for raw in raws:
                self.upsert_node(raw)
                seen.add(str((raw.get("metadata") or {}).get("name")))
            for spec in list(self.state.specs):
                if spec.name not in seen and self.state.present[self.state.index[spec.name]]:
                    self.remove_node(spec.name)
            self.nodes_synced = True

    # ----------------------------------------------------------------------------------- pods
    def upsert_pod(self, pod: Mapping[str, Any] | Any) -> None:
        """Apply an ADDED/MODIFIED pod."""
        raw = as_dict(pod)
        record = self._record(raw)
        with self.lock:
            if record is None:
                try:
                    key = pod_key(raw)
                except TranslationError:
                    return
                if key in self.pods:
                    self._forget(key)
                return
            old = self.pods.get(record.key)
            if old is not None and old.uid != record.uid:
                self._forget(record.key)  # same name, new pod
            self.pods[record.key] = record
            self.uids[record.uid] = record.key
            if record.assignment is not None:
                self._waiting_on_node.setdefault(record.assignment.node, set()).add(record.key)
            self._reconcile(record.key)

    def remove_pod(self, pod: Mapping[str, Any] | Any) -> None:
        """Apply a DELETED pod: its cards are free again (a bind in flight keeps its reservation)."""
        raw = as_dict(pod)
        try:
            key = pod_key(raw)
        except TranslationError:
            return
        with self.lock:
            uid = str((raw.get("metadata") or {}).get("uid") or "")
            record = self.pods.get(key)
            if record is not None and uid and record.uid != uid:
                return  # a delete of an older pod of the same name
            self._pins.pop(key, None)
            self._forget(key)

    def replace_pods(self, pods: Iterable[Mapping[str, Any] | Any]) -> None:
        """Apply a full list of pods: upsert all, forget the rest (except binds in flight)."""
        with self.lock:
            seen: set[str] = set()
            for pod in pods:
                raw = as_dict(pod)
                try:
                    key = pod_key(raw)
                except TranslationError:
                    continue
                seen.add(key)
                if self._unchanged(key, raw):
                    continue  # a catch-up or re-list of a current view re-translates nothing
                self.upsert_pod(raw)
            for key in list(self.pods):
                if key not in seen:
                    self._pins.pop(key, None)
                    self._forget(key)
            self.pods_synced = True

    def _unchanged(self, key: str, raw: Mapping[str, Any]) -> bool:
        """Whether the record of ``key`` was made from this very object version (same uid and
        resourceVersion; never for objects without a version)."""
        record = self.pods.get(key)
        if record is None or record.raw is None:
            return False
        meta = raw.get("metadata") or {}
        version = meta.get("resourceVersion")
        old = record.raw.get("metadata") or {}
        return bool(version) and version == old.get("resourceVersion") and record.uid == str(meta.get("uid") or "")

    def _forget(self, key: str) -> None:
        record = self.pods.pop(key, None)
        if record is not None:
            self.uids.pop(record.uid, None)
            if record.assignment is not None:
                self._waiting_on_node.get(record.assignment.node, set()).discard(key)
        self._reconcile(key)

    def _record(self, raw: Mapping[str, Any]) -> PodRecord | None:
        """A record for a pod that wants GPUs or carries an assignment; None for other pods."""
        meta = raw.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        assignment_text = annotations.get(self.names.assignment)
        if assignment_text is None and not pod_wants_gpu(raw, self.names):
            return None
        try:
            key = pod_key(raw)
        except TranslationError:
            return None
        problem = None
        request = None
        try:
            request = pod_request(raw, self.names)
        except TranslationError as exc:
            problem = str(exc)
        assignment = None
        if assignment_text is not None:
            try:
                assignment = decode_assignment(assignment_text)
            except AnnotationError as exc:
                problem = f"pod {key}: {exc}"
                log.warning("%s", problem)
        allocated = False
        allocated_text = annotations.get(self.names.allocated)
        if allocated_text is not None:
            try:
                confirmed_on = decode_allocated(allocated_text).node
                allocated = assignment is not None and confirmed_on == assignment.node
            except AnnotationError as exc:
                log.warning("pod %s: %s", key, exc)
        spec = raw.get("spec") or {}
        status = raw.get("status") or {}
        return PodRecord(key=key, uid=str(meta.get("uid") or ""), node_name=str(spec.get("nodeName") or ""),
                         finished=status.get("phase") in FINISHED_PHASES,
                         request=request, assignment=assignment, allocated=allocated, problem=problem,
                         raw=raw)

    # ------------------------------------------------------------------------------- booking
    def _desired(self, key: str) -> Placement | None:
        if key in self._inflight:
            return self._inflight[key]
        record = self.pods.get(key)
        pin = self._pins.get(key)
        if pin is not None:
            seen = record.assignment if record is not None else None
            pinned = (pin.assignment.node, pin.assignment.time)
            observed = seen is not None and (seen.node, seen.time) == pinned
            if observed or self.clock() > pin.deadline or (record is not None and record.finished):
                del self._pins[key]
            else:
                return pin.placement
        if record is None or record.finished or record.assignment is None:
            return None
        assignment = record.assignment
        if record.node_name and record.node_name != assignment.node:
            return None  # bound elsewhere by someone else: the annotation is stale
        if not record.node_name and not record.allocated:
            age = self.clock() - assignment.time.timestamp()
            if age > self.unconfirmed_timeout_s:
                return None
        row = self.state.index.get(assignment.node)
        if row is None or not self.state.present[row]:
            return None
        spec = self.state.specs[row]
        try:
            return assignment.to_placement(key, spec, 0, 0)
        except AnnotationError as exc:
            record.problem = str(exc)
            return None

    def _reconcile(self, key: str) -> None:
        desired = self._desired(key)
        current = self.state.placements.get(key)
        if current == desired:
            return
        if current is not None:
            self.state.release(key)
        if desired is not None:
            try:
                self.state.apply(desired)
                self.conflicts.pop(key, None)
            except AllocationError as exc:
                # Two annotations claim the same space: keep the first, report the second.
                self.conflicts[key] = str(exc)
                log.error("pod %s: assignment cannot be booked: %s", key, exc)

    def expire(self) -> list[str]:
        """Re-evaluate unbound assignments and pins against the clock; returns pods whose booking ended."""
        ended: list[str] = []
        with self.lock:
            keys = [k for k, r in self.pods.items() if r.assignment is not None and not r.node_name]
            for key in {*keys, *self._pins}:
                had = key in self.state.placements
                self._reconcile(key)
                if had and key not in self.state.placements:
                    ended.append(key)
        return ended

    # ---------------------------------------------------------------------- binder reservations
    def reserve(self, request: PodRequest, node: str) -> Placement | Unschedulable:
        """Choose the cards for a bind in flight and book them, atomically under the lock.

        The pod's previous booking (an expired or stale assignment of an earlier attempt, or one
        another replica just wrote) is lifted while the core decides, so a retried bind does not
        compete with itself; it is restored when the pod no longer fits.
        """
        key = request.key
        with self.lock:
            previous = self.state.release(key)
            decision = self.scheduler.assign(request, node)
            if isinstance(decision, Placement):
                booked = strip_host_resources(decision)
                try:
                    self.state.apply(booked)
                except AllocationError as exc:  # assign() checked it under this lock; kept as a guard
                    decision = Unschedulable(key, str(exc))
                else:
                    self._inflight[key] = booked
                    return decision
            if previous is not None:
                self.state.apply(previous)
            return decision

    def commit(self, key: str, assignment: Assignment) -> None:
        """The bind succeeded: hold the placement until the watch shows the annotation."""
        with self.lock:
            placement = self._inflight.pop(key, None)
            if placement is None:
                return
            self._pins[key] = _Pin(placement, assignment, self.clock() + PIN_SECONDS)
            self._reconcile(key)

    def rollback(self, key: str) -> None:
        """The bind failed: give the reservation back and book what the API last said instead."""
        with self.lock:
            self._inflight.pop(key, None)
            self._reconcile(key)

    def in_flight(self) -> int:
        """Binds currently holding a reservation."""
        with self.lock:
            return len(self._inflight)

    def pod_object(self, key: str) -> dict[str, Any] | None:
        """The last pod object the watch delivered for ``key`` (GPU pods only), or None."""
        with self.lock:
            record = self.pods.get(key)
            return dict(record.raw) if record is not None and record.raw is not None else None

    def key_for_uid(self, uid: str) -> str | None:
        """``namespace/name`` of a known GPU pod by uid."""
        with self.lock:
            return self.uids.get(uid)

    def node_spec_of(self, name: str) -> NodeSpec | None:
        """The spec of a present node."""
        with self.lock:
            row = self.state.index.get(name)
            if row is None or not self.state.present[row]:
                return None
            return self.state.specs[row]


def served_aliases(node: Mapping[str, Any]) -> frozenset[str]:
    """The foreign aliases a node's kubelet advertises (its node agent serves them as devices).

    kubelet lists a device plugin's resource in the node's capacity and allocatable once the plugin
    registered (with 0 while every card is unhealthy, which still means "served": the card check
    then refuses with the better reason).
    """
    status = node.get("status") or {}
    listed = {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}
    return frozenset(name for name in listed if name in ALIASES)


def now_utc() -> dt.datetime:
    """The current time, timezone-aware (assignments are stamped with it)."""
    return dt.datetime.now(dt.UTC)
