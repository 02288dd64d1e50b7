"""What the node grants one container, as the interception library reads it (the grant file).

The limits come from the scheduler's assignment on the pod (the same slices :func:`build_grant`
turns into the environment), so the file and the environment agree; the file is what binds,
because the container cannot change it (read-only mount, path compiled into the library) while it
can change its environment at will. A container with no assignment gets no grant: Allocate is
refused rather than handing out a grant that limits nothing. A virtual-card slice (one card booked
as ``devices`` = n) is granted as that one card with ``virtual_devices`` = n: the library presents
n CUDA ordinals, each with an even part of the card's memory (docs/virtual-cards.md).
"""

from __future__ import annotations

from gpupool.api.shim_contract import CONTAINER_AGENT_SOCKET, CONTAINER_REGION_PATH, NodeGrant
from gpupool.nodeagent.container_grant import GrantError, compute_percent
from gpupool.nodeagent.types import PodView


def node_grant(pod: PodView, container: str, token: str, compute_mode: str) -> NodeGrant:
    """The grant of ``container`` in ``pod``; :class:`GrantError` when the pod assigns it nothing."""
    assignment = pod.assignment.container(container) if pod.assignment is not None else None
    if assignment is None or not assignment.slices:
        raise GrantError(f"{pod.namespace}/{pod.name}/{container}: no assignment to write the library's grant from")
    uuids = pod.assignment.uuids if pod.assignment is not None else {}
    known = tuple(uuids.get(s.card, "") for s in assignment.slices)
    devices = max(s.devices for s in assignment.slices)
    if devices > 1 and len(assignment.slices) != 1:
        raise GrantError(f"{pod.namespace}/{pod.name}/{container}: a card presented as {devices} devices must be the "
                         f"container's only card, the assignment has {len(assignment.slices)}")
    return NodeGrant(memory_mib=tuple(s.memory_mib for s in assignment.slices),
                     compute_percent=tuple(compute_percent(s.compute) for s in assignment.slices),
                     compute_mode=compute_mode,
                     card_uuids=known if all(known) else (),  # partial UUIDs would shift the ordinals
                     region=CONTAINER_REGION_PATH, socket=CONTAINER_AGENT_SOCKET, token=token,
                     pod=f"{pod.namespace}/{pod.name}", container=container, virtual_devices=devices)
