"""A ResourceClaim's allocation, as this node's driver reads it: which of its cards, how much of each.

kubelet's NodePrepareResources names a claim (namespace, name, UID) and nothing else; the
scheduler's decision is in the claim's ``status.allocation`` (each result: request, driver, pool,
device, and with consumable capacity ``consumedCapacity`` and a ``shareID``). Only the results of
this driver are ours. Everything is checked here, once, with a reason a person can act on, so the
plugin never prepares half a claim.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.kube.quantity import QuantityError, parse_quantity
from gpupool.nodeagent.dra.resource_slice import COMPUTE, COMPUTE_PERCENT, MEMORY, MIB, card_of


class ClaimError(ValueError):
    """The claim cannot be prepared on this node; the message says why."""


@dataclass(frozen=True)
class ClaimRef:
    """What kubelet names: the claim's namespace, name and UID."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class AllocatedShare:
    """One allocation result of this driver: a share of one card.

    ``memory_mib`` is ``None`` when the allocator recorded no consumed memory (a device allocated
    without consumable capacity): the container gets the whole card then."""

    request: str
    pool: str
    device: str
    card: int
    memory_mib: int | None
    compute_percent: int
    share_id: str | None = None


@dataclass(frozen=True)
class ClaimAllocation:
    """A claim allocated on this node: its shares, and the pod it is reserved for (the first pod
    consumer; ``("", "")`` when none is named)."""

    claim: ClaimRef
    pod: tuple[str, str]
    pod_uid: str
    shares: tuple[AllocatedShare, ...]


def read_allocation(claim: ClaimRef, obj: Mapping[str, Any], driver: str, pool: str) -> ClaimAllocation:
    """The claim object ``obj`` (JSON as the API serves it) read for ``driver`` on ``pool``."""
    meta = obj.get("metadata") or {}
    uid = meta.get("uid")
    if uid != claim.uid:
        raise ClaimError(f"claim {claim}: the API has UID {uid!r} under that name (deleted and re-created?)")
    status = obj.get("status") or {}
    allocation = status.get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(f"claim {claim} is not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    if not isinstance(results, list):
        raise ClaimError(f"claim {claim}: status.allocation.devices.results is not a list")
    shares = tuple(_share(claim, r, pool) for r in results
                   if isinstance(r, Mapping) and r.get("driver") == driver)
    if not shares:
        raise ClaimError(f"claim {claim} has no device of driver {driver}")
    namespace = claim.namespace
    pods = [r for r in status.get("reservedFor") or [] if isinstance(r, Mapping) and r.get("resource") == "pods"]
    pod = (namespace, str(pods[0].get("name", ""))) if pods else ("", "")
    pod_uid = str(pods[0].get("uid", "")) if pods else ""
    return ClaimAllocation(claim, pod, pod_uid, shares)


def _share(claim: ClaimRef, result: Mapping[str, Any], pool: str) -> AllocatedShare:
    device = str(result.get("device", ""))
    where = f"claim {claim}, request {result.get('request', '')!r}, device {device!r}"
    if result.get("pool") != pool:
        raise ClaimError(f"{where}: allocated from pool {result.get('pool')!r}, this node's pool is {pool!r}")
    try:
        card = card_of(device)
    except ValueError as exc:
        raise ClaimError(f"{where}: {exc}") from None
    consumed = result.get("consumedCapacity") or {}
    if not isinstance(consumed, Mapping):
        raise ClaimError(f"{where}: consumedCapacity is not a map")
    memory = None
    compute = 0
    try:
        if MEMORY in consumed:
            memory = math.ceil(parse_quantity(consumed[MEMORY]) / MIB)
        if COMPUTE in consumed:
            compute = math.ceil(parse_quantity(consumed[COMPUTE]))
    except QuantityError as exc:
        raise ClaimError(f"{where}: consumedCapacity: {exc}") from None
    if memory is not None and memory <= 0:
        raise ClaimError(f"{where}: consumed memory {consumed[MEMORY]!r} is not positive")
    if not 0 <= compute <= COMPUTE_PERCENT:
        raise ClaimError(f"{where}: consumed compute {consumed[COMPUTE]!r} is not 0-{COMPUTE_PERCENT} percent")
    share_id = result.get("shareID")
    return AllocatedShare(str(result.get("request", "")), pool, device, card, memory, compute,
                          str(share_id) if share_id else None)
