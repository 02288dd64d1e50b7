"""The node agent's side of ``<domain>/allocated-v1``: its served containers in and out of the schema.

The schema itself (and its strict reader) lives in :mod:`gpupool.api.annotations`, shared
with the extender: the extender reads ``node`` to confirm a booking, the node agent reads the
containers back after a restart to know which of them kubelet already had served. Two copies of
the schema drift apart: a node writing ``"version"`` where the extender reads ``"v"`` confirms no
pod at all.
"""

from __future__ import annotations

import datetime as dt

from gpupool.api.annotations import (
    Allocated,
    AllocatedContainer,
    CardRef,
    decode_allocated,
    encode_allocated,
)
from gpupool.nodeagent.served_container import ServedContainer


def encode_served(node: str, when: dt.datetime, served: list[ServedContainer]) -> str:
    """The node agent's encoder: what each container was served, as ``allocated-v1``."""
    containers = tuple(
        AllocatedContainer(
            name=c.name, init=c.init, resources=dict(c.resources),
            cards=tuple(CardRef(index=s.card, uuid=u, memory_mib=s.memory_mib, compute=s.compute,
                                exclusive=s.exclusive)
                        for s, u in zip(c.record.slices, c.record.uuids, strict=True)))
        for c in served)
    return encode_allocated(Allocated(node=node, time=when, containers=containers))


def served_resources(text: str) -> dict[str, frozenset[str]]:
    """Container name → resources already served, from an ``allocated-v1`` value.

    Raises :class:`gpupool.api.annotations.AnnotationError` for a malformed value.
    """
    return {c.name: frozenset(c.resources) for c in decode_allocated(text).containers}
