"""Which pods the extender keeps from the watch, and what it logs of them.

Why its own module: reading a pod object is the cache's input side (Kubernetes JSON in, checked
values out) and has nothing to do with how bookings evolve (:mod:`gpupool.extender.bookings`) or
how the ledger is kept (:mod:`gpupool.extender.cache`). The reading itself and the rule for what a
record holds are shared with the kubectl plugin (:mod:`gpupool.kube.pod_holding`); what is the
extender's own is the choice of pods it keeps and the log of what it cannot read.

Kept are pods that ask for GPUs or carry an assignment (the binder needs them while pending), and
every pod bound to a node and not finished: its CPU and memory count on that node, GPUs or not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpupool.api.names import ResourceNames
from gpupool.extender.request_memo import RequestMemo
from gpupool.kube.pod_holding import FINISHED_PHASES, PodRecord, pod_record
from gpupool.kube.translate import pod_wants_gpu

log = logging.getLogger(__name__)


def read_pod(raw: Mapping[str, Any], names: ResourceNames, memo: RequestMemo | None = None) -> PodRecord | None:
    """A record of the pod, or None for a pod the extender has no business with (no GPUs, no
    assignment, not bound, or finished without either). ``memo``: where the pod's request is
    looked up before it is translated (:mod:`gpupool.extender.request_memo`)."""
    meta = raw.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    wants_gpu = pod_wants_gpu(raw, names)
    if annotations.get(names.assignment) is None and not wants_gpu and \
            (not spec.get("nodeName") or status.get("phase") in FINISHED_PHASES):
        return None
    record = pod_record(raw, names, wants_gpu=wants_gpu, translate=memo.request if memo is not None else None)
    if record is None:
        return None
    if record.assignment_unreadable:
        log.warning("%s", record.problem)
    if record.allocated_problem is not None:
        log.warning("pod %s: %s", record.key, record.allocated_problem)
    return record
