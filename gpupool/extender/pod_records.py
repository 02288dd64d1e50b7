"""What the extender keeps of one pod from the watch: its request, assignment, binding and phase.

Why its own module: reading a pod object is the cache's input side (Kubernetes JSON in, checked
values out) and has nothing to do with how bookings evolve (:mod:`gpupool.extender.bookings`) or
how the ledger is kept (:mod:`gpupool.extender.cache`).

Kept are pods that ask for GPUs or carry an assignment (the binder needs them while pending), and
every pod bound to a node and not finished: its CPU and memory count on that node, GPUs or not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.annotations import AnnotationError, Assignment, decode_allocated, decode_assignment
from gpupool.api.names import ResourceNames
from gpupool.core.model import PodRequest
from gpupool.kube.translate import TranslationError, pod_key, pod_request, pod_wants_gpu

log = logging.getLogger(__name__)

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
"""Phases whose containers have stopped for good: the pod holds nothing any more."""


@dataclass(frozen=True)
class PodRecord:
    """One pod as the cache keeps it.

    ``problem``: why the pod's request or assignment could not be read (None when both could).
    ``assignment_unreadable``: the pod carries an assignment that does not decode.
    ``raw``: the object itself, kept for GPU pods only (the binder's first attempt reads it instead
    of the API); other pods are never bound by the extender, so their objects are not kept.
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
    problem: str | None = None
    assignment_unreadable: bool = False
    raw: Mapping[str, Any] | None = None

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


def read_pod(raw: Mapping[str, Any], names: ResourceNames) -> PodRecord | None:
    """A record of the pod, or None for a pod the extender has no business with (no GPUs, no
    assignment, not bound, or finished without either)."""
    meta = raw.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    assignment_text = annotations.get(names.assignment)
    node_name = str(spec.get("nodeName") or "")
    finished = status.get("phase") in FINISHED_PHASES
    wants_gpu = pod_wants_gpu(raw, names)
    if assignment_text is None and not wants_gpu and (not node_name or finished):
        return None
    try:
        key = pod_key(raw)
    except TranslationError:
        return None
    problem = None
    request = None
    try:
        request = pod_request(raw, names)
    except TranslationError as exc:
        problem = str(exc)
    assignment = None
    unreadable = False
    if assignment_text is not None:
        try:
            assignment = decode_assignment(assignment_text)
        except AnnotationError as exc:
            problem = f"pod {key}: {exc}"
            unreadable = True
            log.warning("%s", problem)
    allocated = False
    allocated_text = annotations.get(names.allocated)
    if allocated_text is not None:
        try:
            confirmed_on = decode_allocated(allocated_text).node
            allocated = assignment is not None and confirmed_on == assignment.node
        except AnnotationError as exc:
            log.warning("pod %s: %s", key, exc)
    return PodRecord(key=key, uid=str(meta.get("uid") or ""), version=str(meta.get("resourceVersion") or ""),
                     node_name=node_name, finished=finished, wants_gpu=wants_gpu, request=request,
                     assignment=assignment, allocated=allocated, problem=problem,
                     assignment_unreadable=unreadable, raw=raw if wants_gpu or assignment_text is not None else None)
