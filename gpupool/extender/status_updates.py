"""A pod's record carried over an update that changes nothing it was read from (a status update).

Why: most events of a GPU pod's watch after its bind change only its status: kube-scheduler's
conditions, then the kubelet's (or KWOK's) Running, conditions and container states, and every
later probe. Reading the record again decodes the pod's ``assignment-v1`` and looks up its request
for nothing: what the record holds comes from the pod's metadata, its spec and whether its phase is
``Succeeded``/``Failed`` (:func:`gpupool.kube.pod_holding.pod_record` and
:func:`gpupool.extender.pod_records.read_pod` read no other field). When those equal the ones of the
object the earlier record was read from, the earlier record is what reading the new object gives;
only its resourceVersion and the object kept with it are the new ones (the binder writes with the
object's version as a precondition, so it must be current).

The comparison is of whole parts, not of the fields read today: every metadata field but
``resourceVersion`` and ``managedFields`` (the kubelet's status writes change both), the whole spec,
and the phase as finished or not. A change of any of them (an annotation, the node name, the end of
the pod) is read again in full. Only records that keep their object (GPU pods and pods with an
assignment, :class:`gpupool.kube.pod_holding.PodRecord`'s ``raw``) can be compared; the others are
read again as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpupool.kube.pod_holding import FINISHED_PHASES, PodRecord

CHANGED_BY_STATUS = frozenset({"resourceVersion", "managedFields"})
"""Metadata fields a status write changes; the record reads neither (its version is taken anew)."""


def listed_key(raw: Mapping[str, Any]) -> str | None:
    """The key the pod would be kept under, unchecked (None without a metadata object): only for
    finding its earlier record, whose metadata :func:`carried_over` then compares in full."""
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def carried_over(earlier: PodRecord | None, raw: Mapping[str, Any]) -> PodRecord | None:
    """``earlier`` for the pod object ``raw`` when they differ only in what the record does not read
    (see the module docstring); None when ``raw`` must be read."""
    if earlier is None or earlier.raw is None:
        return None
    before = earlier.raw
    meta, old_meta = raw.get("metadata"), before.get("metadata")
    status = raw.get("status") or {}
    if not isinstance(meta, Mapping) or not isinstance(old_meta, Mapping) or not isinstance(status, Mapping):
        return None
    # Cheapest first, and what the other updates change first: the assignment (metadata), the
    # bind (the spec's node name); the whole spec last (an object of its own, far from the new one).
    if (status.get("phase") in FINISHED_PHASES) != earlier.finished or not _same_except_status_writes(meta, old_meta):
        return None
    spec, old_spec = raw.get("spec"), before.get("spec")
    if not isinstance(spec, Mapping) or not isinstance(old_spec, Mapping) or \
            spec.get("nodeName") != old_spec.get("nodeName") or spec != old_spec:
        return None
    return dataclasses.replace(earlier, version=str(meta.get("resourceVersion") or ""), raw=raw)


def _same_except_status_writes(meta: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Whether two metadata objects hold the same fields with equal values, :data:`CHANGED_BY_STATUS` aside."""
    compared = 0
    for field, value in meta.items():
        if field in CHANGED_BY_STATUS:
            continue
        if field not in old or old[field] != value:
            return False
        compared += 1
    return compared == sum(1 for field in old if field not in CHANGED_BY_STATUS)
