"""What an allocated ResourceClaim of gpupool's driver holds in a ledger: its key, its record and its
placement on the node its pool names.

One reading for every component that books claims beside pods: the extender's ledger
(:mod:`gpupool.extender.dra_bookings`) and the kubectl plugin's snapshot
(:mod:`gpupool.kubectl.snapshot`), so that ``kubectl gpupool inspect`` and ``why`` see the cards
claims hold exactly as the extender books them. The shares come from
:func:`gpupool.kube.dra_claims.claim_shares`, the reading the node agent prepares from.

Keys: ``<namespace>/claim:<name>``. A pod's name cannot contain ``:``, so a claim never shares a
key with a pod, and the namespace before the ``/`` makes it count for that namespace's quota.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.core.model import CardSlice, ContainerAssignment, NodeSpec, Placement
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.kube.dra_claims import AllocatedShare, ClaimError, claim_shares

CLAIM_MARK = "claim:"
PER_MILLE_PER_PERCENT = COMPUTE_PER_CARD // 100
"""Claims consume compute in percent of a card; the ledger books per mille."""


def claim_key(namespace: str, name: str) -> str:
    """The ledger key of claim ``namespace/name`` (never a pod's: pod names have no ``:``)."""
    return f"{namespace}/{CLAIM_MARK}{name}"


def is_claim_key(key: str) -> bool:
    """Whether a ledger key is a claim's."""
    return f"/{CLAIM_MARK}" in key


@dataclass(frozen=True)
class ClaimRecord:
    """What one claim holds of gpupool's cards, as read from the API.

    ``node``: the node its shares are on (their pool), ``""`` when it cannot be told. ``problem``:
    why the allocation cannot be booked (``None`` when it can)."""

    key: str
    uid: str
    node: str
    shares: tuple[AllocatedShare, ...] = ()
    problem: str | None = None
    users: tuple[str, ...] = ()
    """The UIDs of the consumers it is reserved for (``status.reservedFor``; ``""`` for an entry
    without one). Why kept: the claim's share of its cards is freed only when every one of them
    is gone, so the extender's preemption frees it only when they are all victims
    (:mod:`gpupool.extender.victims`); a consumer that is not a pod is never one."""


def read_claim(obj: Mapping[str, Any], driver: str) -> ClaimRecord | None:
    """The record of ``obj`` (a ResourceClaim as the API serves it), or ``None`` when it holds none
    of ``driver``'s devices (not allocated, or allocated from other drivers only). Never raises for
    a claim with a name: what cannot be read becomes the record's ``problem``."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    if not name:
        return None
    key, uid = claim_key(namespace, name), str(meta.get("uid") or "")
    status = obj.get("status")
    if not isinstance(status, Mapping) or status.get("allocation") is None:
        return None  # not allocated: holds nothing
    users = _users_of(status)
    results = _results_of(status)
    ours = [r for r in results or [] if isinstance(r, Mapping) and r.get("driver") == driver]
    if results is not None and not ours:
        return None  # allocated from other drivers only
    try:
        read = claim_shares(obj, driver, where=f"claim {namespace}/{name}")
    except ClaimError as exc:  # the node is still told where it can be (its placements then stop)
        pools = sorted({str(r.get("pool") or "") for r in ours} - {""})
        return ClaimRecord(key, uid, pools[0] if len(pools) == 1 else "", problem=str(exc), users=users)
    if not read.shares:
        return None
    nodes = sorted({s.pool for s in read.shares})
    if len(nodes) != 1 or not nodes[0]:
        return ClaimRecord(key, uid, nodes[0] if len(nodes) == 1 else "", read.shares,
                           f"claim {namespace}/{name}: its devices of {driver} come from pools {nodes}; "
                           "gpupool's pools are node names, one node per claim", users)
    return ClaimRecord(key, uid, nodes[0], read.shares, users=users)


def _users_of(status: Mapping[str, Any]) -> tuple[str, ...]:
    """The UIDs ``status.reservedFor`` names, in its order (a malformed entry reads as ``""``, a
    consumer nobody can evict)."""
    reserved = status.get("reservedFor")
    if not isinstance(reserved, list):
        return ()
    return tuple(str(r.get("uid") or "") if isinstance(r, Mapping) else "" for r in reserved)


def _results_of(status: Mapping[str, Any]) -> list[Any] | None:
    allocation = status.get("allocation")
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    return results if isinstance(results, list) else None


def claim_placement(record: ClaimRecord, spec: NodeSpec) -> Placement:
    """The claim's shares as a placement on ``spec``'s ledger positions (one container named after
    the claim); :class:`ClaimError` for a share of a card the node does not publish. A share that
    consumed no memory holds its card whole (allocated without consumable capacity)."""
    positions = {card.index: pos for pos, card in enumerate(spec.cards)}
    slices = []
    for share in record.shares:
        pos = positions.get(share.card)
        if pos is None:
            raise ClaimError(f"claim {record.key.replace(CLAIM_MARK, '')}: device {share.device} is not among "
                             f"node {spec.name}'s cards (it publishes {sorted(positions)})")
        card = spec.cards[pos]
        if share.memory_mib is None:
            slices.append(CardSlice(pos, card.memory_mib, card.compute, exclusive=True))
        else:
            slices.append(CardSlice(pos, share.memory_mib, share.compute_percent * PER_MILLE_PER_PERCENT))
    return Placement(record.key, spec.name, 0, 0, (ContainerAssignment(record.key, tuple(slices)),))


def claim_booking(record: ClaimRecord, spec: NodeSpec | None) -> tuple[Placement | None, str | None]:
    """What a ledger books for ``record`` on its node's ``spec`` (None: the node is not in the
    ledger): its placement, or why it cannot be booked (the record's own problem, or a share of a
    card the node does not publish). Neither, for a claim whose node is absent: it holds nothing
    there until the node is back."""
    if record.problem is not None:
        return None, record.problem
    if spec is None:
        return None, None
    try:
        return claim_placement(record, spec), None
    except ClaimError as exc:
        return None, str(exc)

