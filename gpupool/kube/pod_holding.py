"""What one pod object holds in the ledger: the rule the extender and the kubectl plugin share.

Why here, below both products: the extender books pods from its watch and the plugin from one list,
and both must agree on what every pod holds, or the plugin would explain a ledger the extender does
not keep. The rule needs nothing of either product (no pins, no clock of its own, no watch), so it
lives with the rest of the Kubernetes translation; each product maps :class:`Holding` to its own
terms (the extender to the events of its booking table, the plugin to its snapshot).

:func:`pod_record` reads a pod object into checked values (it never raises on bad annotations and
never logs: the extender logs what it keeps, the plugin reports problems in its answer).
:func:`holding` classifies a record:

* finished (``Succeeded``/``Failed``) → nothing;
* no readable assignment, or one for another node than the pod is bound to (stale): nothing before
  the pod is bound, else its CPU and memory on its node (host-only); ``UNREADABLE`` when the
  assignment does not decode (its cards are unknown, so the node takes no GPU pod);
* an assignment whose ``podUID`` is another pod's (v1.20-v1.22 bind a pod replaced under the name
  of the one the cards were decided for): the same, as if it did not decode (``UNREADABLE`` when
  bound and asking for GPUs: the node agent refuses it, an older agent might grant it);
* an assignment neither bound nor confirmed (``allocated-v1``) past the unconfirmed timeout →
  ``EXPIRED``: the extender let it go;
* a node the ledger does not have → ``UNKNOWN_NODE``;
* an assignment naming cards its node does not have: ``UNREADABLE`` when bound, nothing before;
* else the placement it names, annotated, bound, or confirmed by the node agent; a borrower's
  (``gpupool.io/borrowed``) counts against the loans of its cards, not against their owners'.

A remote share (``remote-share-v1``, read when the pod has no ``assignment-v1``) is read as an
assignment of its server node holding the slice only: not stale for naming another node than the
one the pod is bound to; a server node the ledger does not have (gone) holds nothing.

A bound pod without an ``assignment-v1`` that HAMi, gpushare or GPUManager placed holds the cards
their annotations name (:mod:`gpupool.kube.adoption`): booked as bound, so a node is migrated
without draining; annotations that name no card on its node make it ``UNREADABLE``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpupool.api.annotations import (
    AnnotationError,
    Assignment,
    decode_allocated,
    decode_assignment,
    foreign_assignment,
)
from gpupool.api.lending import LendingNames, is_borrowed
from gpupool.api.names import ResourceNames
from gpupool.api.remote_share import decode_remote_share
from gpupool.core.model import NodeSpec, Placement, PodRequest
from gpupool.kube.adoption import Adoption, AdoptionError, adoption
from gpupool.kube.translate import TranslationError, pod_key, pod_request, pod_wants_gpu

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
"""Phases whose containers have stopped for good: the pod holds nothing any more."""


@dataclass(frozen=True)
class PodRecord:
    """One pod object as read: its request, assignment, binding and phase.

    ``request_problem``: why the request could not be read; ``assignment_problem``: why the
    assignment annotation does not decode or is another pod's (its ``podUID``);
    ``allocated_problem``: why ``allocated-v1`` does not (None when it reads or is absent).
    ``raw``: the object itself, kept for GPU pods and pods with an assignment only (the extender's
    binder reads it instead of the API; other pods are never bound by the extender, so their
    objects are not kept).
    """

    key: str
    uid: str
    version: str
    node_name: str
    finished: bool
    wants_gpu: bool
    request: PodRequest | None
    assignment: Assignment | None
    allocated: bool
    request_problem: str | None = None
    assignment_problem: str | None = None
    allocated_problem: str | None = None
    raw: Mapping[str, Any] | None = None
    borrowed_from: str | None = None
    """The owner whose lent cards the pod borrows (``gpupool.io/borrowed``: its cards count against
    their loans, :mod:`gpupool.core.lent`); None for a pod that does not borrow."""
    remote: bool = False
    """``assignment`` was read from ``remote-share-v1`` (:mod:`gpupool.api.remote_share`): it names
    the server node, not the node the pod runs on, and holds the slice alone (no CPU or memory)."""
    adopted: Adoption | None = None
    """The cards another system (HAMi, gpushare, GPUManager) placed the pod on, from its annotations;
    read only for pods without an ``assignment-v1``."""
    adoption_problem: str | None = None
    """Why those annotations name no card (the pod's node then takes no GPU pod), or why some card is
    booked whole (:attr:`Adoption.problem`)."""

    @property
    def problem(self) -> str | None:
        """Why the pod's assignment (first) or request could not be read; None when both could."""
        if self.assignment_problem is not None:
            return f"pod {self.key}: {self.assignment_problem}"
        return self.request_problem

    @property
    def assignment_unreadable(self) -> bool:
        """Whether the pod carries an assignment it cannot use: one that does not decode, or one
        decided for another pod (then ``assignment`` holds it, decoded)."""
        return self.assignment_problem is not None

    @property
    def cpu_milli(self) -> int:
        """CPU the pod holds on its node (0 when its request could not be read)."""
        return self.request.cpu_milli if self.request is not None else 0

    @property
    def memory_mib(self) -> int:
        """Memory the pod holds on its node (0 when its request could not be read)."""
        return self.request.memory_mib if self.request is not None else 0

    def same_object(self, raw: Mapping[str, Any]) -> bool:
        """Whether this record was made from this very object version (same uid and
        resourceVersion; never for objects without a version)."""
        meta = raw.get("metadata") or {}
        version = meta.get("resourceVersion")
        return bool(version) and str(version) == self.version and self.uid == str(meta.get("uid") or "")


def pod_record(raw: Mapping[str, Any], names: ResourceNames, *, wants_gpu: bool | None = None,
               translate: Callable[[Mapping[str, Any]], PodRequest] | None = None) -> PodRecord | None:
    """A record of the pod object, or None when it has no readable namespace and name.

    ``translate``: what gives the pod's request (default :func:`pod_request` with ``names``; the
    extender passes one that remembers the requests of pods it has translated before).

    ``wants_gpu``: :func:`pod_wants_gpu` of the object when the caller has already asked it (the
    extender does, for every pod event, to decide whether to keep the pod at all)."""
    try:
        key = pod_key(raw)
    except TranslationError:
        return None
    meta = raw.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    status = raw.get("status") or {}
    request: PodRequest | None = None
    request_problem: str | None = None
    try:
        request = translate(raw) if translate is not None else pod_request(raw, names)
    except TranslationError as exc:
        request_problem = str(exc)
    assignment_text = annotations.get(names.assignment)
    remote_text = annotations.get(names.remote_share) if assignment_text is None else None
    assignment: Assignment | None = None
    assignment_problem: str | None = None
    if assignment_text is not None or remote_text is not None:
        try:
            assignment = (decode_assignment(assignment_text) if assignment_text is not None
                          else decode_remote_share(str(remote_text)).as_assignment())
        except AnnotationError as exc:
            assignment_problem = str(exc)
        else:
            assignment_problem = foreign_assignment(assignment.pod_uid, str(meta.get("uid") or ""))
    allocated = False
    allocated_problem: str | None = None
    allocated_text = annotations.get(names.allocated)
    if allocated_text is not None:
        try:
            confirmed_on = decode_allocated(allocated_text).node
            allocated = assignment is not None and confirmed_on == assignment.node
        except AnnotationError as exc:
            allocated_problem = str(exc)
    if wants_gpu is None:
        wants_gpu = pod_wants_gpu(raw, names)
    adopted: Adoption | None = None
    adoption_problem: str | None = None
    if assignment_text is None:
        try:
            adopted = adoption(raw, names)
        except AdoptionError as exc:
            adoption_problem = str(exc)
        else:
            adoption_problem = adopted.problem if adopted is not None else None
    lending = LendingNames(names.domain)
    borrowed_from = str(annotations.get(lending.borrowed_from) or "") if is_borrowed(annotations, lending) else None
    return PodRecord(key=key, uid=str(meta.get("uid") or ""), version=str(meta.get("resourceVersion") or ""),
                     node_name=str((raw.get("spec") or {}).get("nodeName") or ""),
                     finished=status.get("phase") in FINISHED_PHASES, wants_gpu=wants_gpu, request=request,
                     assignment=assignment, allocated=allocated, request_problem=request_problem,
                     assignment_problem=assignment_problem, allocated_problem=allocated_problem,
                     raw=raw if wants_gpu or assignment_text is not None or remote_text is not None else None,
                     borrowed_from=borrowed_from, remote=remote_text is not None,
                     adopted=adopted, adoption_problem=adoption_problem)


class HoldingKind(StrEnum):
    """The kinds of what a pod object holds; only ``HOST_ONLY``, ``UNREADABLE`` and ``PLACEMENT``
    hold anything."""

    NOTHING = "nothing"
    """Finished, or not bound and without a usable assignment."""
    EXPIRED = "expired"
    """An assignment neither bound nor confirmed for longer than the unconfirmed timeout."""
    UNKNOWN_NODE = "unknown_node"
    """It names a node the ledger does not have (yet)."""
    HOST_ONLY = "host_only"
    """Bound without an assignment for its node: its CPU and memory there, no cards."""
    UNREADABLE = "unreadable"
    """Bound with an assignment that cannot be used: host-only, and its node takes no GPU pod."""
    PLACEMENT = "placement"
    """The cards, CPU and memory its assignment names."""


@dataclass(frozen=True)
class Holding:
    """What a pod holds: its kind, the placement (None for the kinds that hold nothing), whether it
    is bound and confirmed, and why its assignment cannot be used (``problem``, None when it can
    or there is none)."""

    kind: HoldingKind
    placement: Placement | None = None
    bound: bool = False
    confirmed: bool = False
    problem: str | None = None

    @property
    def annotated(self) -> bool:
        """Whether it holds a placement by its assignment alone (a bind in flight or lost)."""
        return self.kind is HoldingKind.PLACEMENT and not self.bound


def host_only(record: PodRecord, node: str) -> Placement:
    """The pod's CPU and memory on ``node``, no cards."""
    return Placement(pod_key=record.key, node=node, cpu_milli=record.cpu_milli, memory_mib=record.memory_mib)


def _adopted(record: PodRecord, bound: str, spec_of: Callable[[str], NodeSpec | None]) -> Holding:
    """What a pod another system placed on ``bound`` holds there (see the module docstring)."""
    spec = spec_of(bound)
    if spec is None:
        return Holding(HoldingKind.UNKNOWN_NODE, bound=True)
    try:
        if record.adopted is None:
            raise AdoptionError(record.adoption_problem or "unreadable")
        adopted = record.adopted.on(bound)
        placement = adopted.placement(record.key, spec, record.cpu_milli, record.memory_mib)
    except AdoptionError as exc:
        return Holding(HoldingKind.UNREADABLE, host_only(record, bound), bound=True, problem=str(exc))
    return Holding(HoldingKind.PLACEMENT, placement, bound=True, problem=adopted.problem)


def holding(record: PodRecord, spec_of: Callable[[str], NodeSpec | None], *, now: float,
            unconfirmed_timeout_s: float) -> Holding:
    """What ``record`` holds at ``now`` (epoch seconds); see the module docstring.

    ``spec_of`` gives a present node's spec (None for a node the ledger does not have).
    """
    assignment = record.assignment
    bound = record.node_name
    problem = record.assignment_problem
    if record.finished:
        return Holding(HoldingKind.NOTHING, problem=problem)
    if assignment is None and bound and (record.adopted is not None or record.adoption_problem is not None):
        return _adopted(record, bound, spec_of)
    foreign = assignment is not None and problem is not None  # decided for a pod this one replaced
    if assignment is None or foreign or (bound and bound != assignment.node and not record.remote):
        if not bound:
            return Holding(HoldingKind.NOTHING, problem=problem)
        if spec_of(bound) is None:
            return Holding(HoldingKind.UNKNOWN_NODE, bound=True, problem=problem)
        # A pod that asks for no GPU is granted no card, whatever assignment it carries.
        unusable = record.assignment_unreadable and (record.wants_gpu or not foreign)
        kind = HoldingKind.UNREADABLE if unusable else HoldingKind.HOST_ONLY
        return Holding(kind, host_only(record, bound), bound=True, problem=problem)
    if not bound and not record.allocated and now - assignment.time.timestamp() > unconfirmed_timeout_s:
        return Holding(HoldingKind.EXPIRED)
    spec = spec_of(assignment.node)
    if spec is None:
        return Holding(HoldingKind.UNKNOWN_NODE, bound=bool(bound))
    try:
        held_cpu, held_memory = (0, 0) if record.remote else (record.cpu_milli, record.memory_mib)
        placement = assignment.to_placement(record.key, spec, held_cpu, held_memory)
    except AnnotationError as exc:
        if bound:
            return Holding(HoldingKind.UNREADABLE, host_only(record, bound), bound=True, problem=str(exc))
        return Holding(HoldingKind.NOTHING, problem=str(exc))
    if record.borrowed_from is not None:
        placement = dataclasses.replace(placement, borrowed_from=record.borrowed_from)
    return Holding(HoldingKind.PLACEMENT, placement, bound=bool(bound), confirmed=record.allocated)
