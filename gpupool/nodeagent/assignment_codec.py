"""The node agent's reading of ``<domain>/assignment-v1``: the extender's document as a NodeAssignment.

The node decodes with the extender's own strict reader (:mod:`gpupool.api.annotations`) so
both sides agree on every field by construction; an earlier separate "tolerant" reader expected
``compute`` where the extender writes ``computeMilli`` and refused every real assignment. This module
only re-shapes the result: cards keep their NVML index (the node has no card positions of its own)
and their uuids, so the grant can refuse an assignment made for a card this node no longer has.
"""

from __future__ import annotations

from gpupool.api.annotations import AnnotationError, decode_assignment
from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.nodeagent.types import NodeAssignment

__all__ = ["AssignmentFormatError", "node_assignment"]

#: A value that does not follow the schema (the extender's error type, re-exported for the node).
AssignmentFormatError = AnnotationError


def node_assignment(text: str, pod_key: str) -> NodeAssignment:
    """Decode pod ``pod_key``'s assignment; :class:`AssignmentFormatError` names the bad field."""
    try:
        doc = decode_assignment(text)
    except AnnotationError as exc:
        raise AssignmentFormatError(f"{pod_key}: {exc}") from None
    uuids: dict[int, str] = {}
    containers = []
    for c in doc.containers:
        slices = []
        for ref in c.cards:
            slices.append(CardSlice(card=ref.index, memory_mib=ref.memory_mib, compute=ref.compute,
                                    exclusive=ref.exclusive, devices=ref.devices))
            uuids[ref.index] = ref.uuid
        containers.append(ContainerAssignment(container=c.name, slices=tuple(slices), init=c.init))
    placement = Placement(pod_key=pod_key, node=doc.node, cpu_milli=0, memory_mib=0,
                          containers=tuple(containers))
    return NodeAssignment(placement=placement, uuids=uuids, time=doc.time.isoformat(), pod_uid=doc.pod_uid)
