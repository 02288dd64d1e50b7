"""What the node agent served one container, gathered over its resources.

The agent builds it at each Allocate answered (:class:`~gpupool.nodeagent.agent.NodeAgent`) and
the ``allocated-v1`` codec writes it (:mod:`gpupool.nodeagent.allocated_codec`). It lives apart from
both so that the codec, and anything else that reads what was served, does not import the agent for
a data type, and beside neither :mod:`gpupool.nodeagent.types` (the ports every module uses, which
the allocation mapper itself imports: holding :class:`ServedRecord`'s user there would make a cycle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.nodeagent.allocation_mapper import ServedRecord


@dataclass
class ServedContainer:
    """What one container was served, accumulated over its resources (for ``allocated-v1``)."""

    name: str
    init: bool
    record: ServedRecord
    """The container's last grant: its cards (``slices``, by NVML index) and their uuids."""
    resources: dict[str, int] = field(default_factory=dict)
    """Resource name → how many devices of it the container was served."""
