"""What a ResourceClaim allocated from gpupool's DRA driver holds: which cards, how much of each.

One reading for every component: the node agent prepares a claim from it, the extender books
the same shares in its ledger (:mod:`gpupool.extender.dra_bookings`). The allocator's decision is
in ``status.allocation``: each result names request, driver, pool (gpupool's pools are node
names), device and, with consumable capacity, ``consumedCapacity`` and a ``shareID``; only the
results of gpupool's driver count.
Everything is checked here, once, with a reason a person can act on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.dra import COMPUTE, COMPUTE_PERCENT, MEMORY, MIB, card_of
from gpupool.kube.quantity import QuantityError, parse_quantity


class ClaimError(ValueError):
    """The claim's allocation cannot be read as gpupool shares; the message says why."""


@dataclass(frozen=True)
class AllocatedShare:
    """One allocation result of gpupool's driver: a share of one card.

    ``memory_mib`` is ``None`` when the allocator recorded no consumed memory (a device allocated
    without consumable capacity): the claim holds the whole card then."""

    request: str
    pool: str
    device: str
    card: int
    memory_mib: int | None
    compute_percent: int
    share_id: str | None = None


@dataclass(frozen=True)
class ClaimShares:
    """An allocated claim: its UID, the first pod it is reserved for (``""`` when none) and its
    shares of gpupool's cards."""

    uid: str
    pod: str
    pod_uid: str
    shares: tuple[AllocatedShare, ...]


def claim_shares(obj: Mapping[str, Any], driver: str, *, where: str = "") -> ClaimShares:
    """The shares ``obj`` (a ResourceClaim as the API serves it) holds of ``driver``'s devices.
    ``where`` names the claim in messages (default: namespace/name)."""
    meta = _map(obj.get("metadata"))
    where = where or f"claim {meta.get('namespace', '')}/{meta.get('name', '')}"
    status = _map(obj.get("status"))
    allocation = status.get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(f"{where} is not allocated")
    devices = allocation.get("devices") or {}
    if not isinstance(devices, Mapping):
        raise ClaimError(f"{where}: status.allocation.devices is not a map")
    results = devices.get("results") or []
    if not isinstance(results, list):
        raise ClaimError(f"{where}: status.allocation.devices.results is not a list")
    shares = tuple(_share(where, r) for r in results if isinstance(r, Mapping) and r.get("driver") == driver)
    reserved = status.get("reservedFor") or []
    pods = [r for r in reserved if isinstance(r, Mapping) and r.get("resource") == "pods"] if isinstance(
        reserved, list) else []
    pod = str(pods[0].get("name", "")) if pods else ""
    pod_uid = str(pods[0].get("uid", "")) if pods else ""
    return ClaimShares(str(meta.get("uid", "")), pod, pod_uid, shares)


def _map(value: object) -> Mapping[str, Any]:
    """``value`` when it is a map, else an empty one (the API's shapes are checked where read)."""
    return value if isinstance(value, Mapping) else {}


def _share(claim: str, result: Mapping[str, Any]) -> AllocatedShare:
    device = str(result.get("device", ""))
    where = f"{claim}, request {result.get('request', '')!r}, device {device!r}"
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
    return AllocatedShare(str(result.get("request", "")), str(result.get("pool", "")), device, card, memory,
                          compute, str(share_id) if share_id else None)
