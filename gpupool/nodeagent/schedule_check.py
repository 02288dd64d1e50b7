"""Verifying a schedule on the node before granting it: the cards exist, are healthy, and this node's
own grants leave room for it.

The extender decided from its ledger; the node knows better what it has *now*. A card can have
failed (an XID) or vanished since the pod was bound, and an extender with a stale or partitioned view
(two leaders for a moment, a restored backup) can book a card twice. kubelet's device counts do not
catch the latter: they are per resource, not per card. So before Allocate hands a container its
cards, the agent checks the container's assignment against its inventory and against the pods it has
already granted on this node (served by this agent, or recorded in their ``allocated-v1`` after a
restart), by the extender's own rule (:meth:`gpupool.core.model.Placement.held_per_card`: app
containers add up, an init container holds its cards alone). A refusal fails Allocate: kubelet
fails the pod with ``UnexpectedAdmissionError`` and its controller creates a new one, which the
extender places afresh.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from gpupool.api.annotations import foreign_assignment
from gpupool.core.model import ContainerAssignment
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.nodeagent.container_grant import GrantError
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.types import PodView

#: The reason of the Warning event a refused pod gets.
REFUSED_REASON = "GpuAssignmentRefused"


class AssignmentRefused(GrantError):
    """The node will not grant this assignment; the message says which card and why."""


class CardStateRefused(AssignmentRefused):
    """Refused because of a card itself (not on the node, or unhealthy): the view the assignment was
    decided from is stale, so the agent publishes its inventory again (the extender's next
    placement, e.g. of the replacement pod, then avoids the card)."""


Holder = tuple[str, int, int, bool]
"""A granted pod on a card: ``namespace/name``, memory MiB, compute per-mille, exclusive."""


def holders(pods: Iterable[PodView], node: str) -> dict[int, list[Holder]]:
    """Per card, the pods holding part of it by their assignments (finished pods hold nothing)."""
    held: defaultdict[int, list[Holder]] = defaultdict(list)
    for pod in pods:
        if pod.terminated or pod.assignment is None or pod.assignment.placement.node not in ("", node):
            continue
        for card, (mib, permille, exclusive) in pod.assignment.placement.held_per_card().items():
            held[card].append((f"{pod.namespace}/{pod.name}", mib, permille, exclusive))
    return held


WHOLE_CARDS_ONLY = ("this node takes whole GPUs only: nothing on it can enforce a share (its agent has no "
                    "isolation backend; docs/isolation-backends.md)")


def refuse_slices(container: ContainerAssignment) -> None:
    """Raise :class:`AssignmentRefused` when ``container`` holds part of a card: on a node that
    cannot enforce shares, only whole cards are granted (an extender that read the node's notice
    places none; this catches one that did not)."""
    if any(not piece.exclusive for piece in container.slices):
        raise AssignmentRefused(f"container {container.container}: {WHOLE_CARDS_ONLY}")


def check_assignment(node: str, inventory: GpuInventory, pod: PodView, container: ContainerAssignment,
                     granted: Iterable[PodView]) -> None:
    """Raise :class:`AssignmentRefused` unless ``container``'s cards may be granted to ``pod``.

    ``granted``: the other pods of this node that hold grants (the pod itself is skipped). An
    assignment decided for another pod (its ``podUID``; a pod replaced under the same name before
    the extender's Binding, which v1.20-v1.22 address by name only) is refused first.
    """
    if pod.assignment is not None:
        foreign = foreign_assignment(pod.assignment.pod_uid, pod.uid)
        if foreign is not None:
            raise AssignmentRefused(foreign)
    cards = {c.index: c for c in inventory.cards}
    for s in container.slices:
        card = cards.get(s.card)
        if card is None:
            raise CardStateRefused(f"card {s.card} is not on node {node} (it has {sorted(cards)})")
        if not card.healthy:
            raise CardStateRefused(f"card {s.card} ({card.uuid}) on node {node} is unhealthy")
    if pod.assignment is None:
        return
    own = pod.assignment.placement.held_per_card()
    others = holders((p for p in granted if p.uid != pod.uid), node)
    for index in sorted({s.card for s in container.slices}):
        card = cards[index]
        mib, permille, exclusive = own.get(index, (0, 0, False))
        held = others.get(index, [])
        names = ", ".join(h[0] for h in held)
        if held and (exclusive or any(h[3] for h in held)):
            raise AssignmentRefused(f"card {index} ({card.uuid}) is exclusive to one pod but already granted "
                                    f"to {names} on node {node}")
        used_mib = sum(h[1] for h in held)
        if used_mib + mib > card.memory_mib:
            raise AssignmentRefused(f"card {index} ({card.uuid}) would be over-committed: {mib} MiB asked, "
                                    f"{used_mib} MiB of {card.memory_mib} MiB already granted to {names}")
        used_compute = sum(h[2] for h in held)
        if used_compute + permille > min(card.compute, COMPUTE_PER_CARD):
            raise AssignmentRefused(f"card {index} ({card.uuid}) would be over-committed: {permille / 10:g} % "
                                    f"compute asked, {used_compute / 10:g} % already granted to {names}")
