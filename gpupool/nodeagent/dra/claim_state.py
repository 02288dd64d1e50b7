"""The one owner of what this node prepared for DRA claims: every prepare and unprepare goes
through :class:`ClaimState` (as the device plugin's calls go through the node agent).

Prepare reads the claim, checks it against the cards this node has and what other prepared claims
hold on them, builds the container grant with the same code an Allocate uses
(:func:`gpupool.nodeagent.container_grant.build_grant`, with the enforcement backend's extras),
writes the claim's CDI spec, then remembers the claim in the checkpoint. A repeated prepare of a
remembered claim answers the same devices without reading anything (kubelet retries; the agent
may have restarted). Unprepare removes the spec and forgets the claim; an unknown claim is already
unprepared. Calls are serialised by one lock: a claim is checked against a settled view of the
cards, and the checkpoint is written once per kubelet call, not once per claim.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.nodeagent.container_grant import GrantError, build_grant
from gpupool.nodeagent.dra import checkpoint
from gpupool.nodeagent.dra.cdi import CdiSpecs
from gpupool.nodeagent.dra.checkpoint import PreparedClaim
from gpupool.nodeagent.dra.claim_allocation import ClaimAllocation, ClaimError, ClaimRef, read_allocation
from gpupool.nodeagent.dra.resource_slice import memory_capacity_mib
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.isolation.backends import Enforcement, NoEnforcement
from gpupool.nodeagent.types import ContainerGrant, NodeAssignment, PodView

log = logging.getLogger(__name__)

ClaimReader = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]
"""(namespace, name) → the ResourceClaim as JSON, ``None`` when it does not exist."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepare answer (the DRA service's ``Device``)."""

    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None


@dataclass
class ClaimStats:
    """Counters and latencies the tests and the benchmark read."""

    prepared: int = 0
    repeated: int = 0
    unprepared: int = 0
    refused: int = 0
    prepare_ms: list[float] = field(default_factory=list)
    unprepare_ms: list[float] = field(default_factory=list)


class ClaimState:
    """Prepared claims of one node: prepare, unprepare, remembered in ``checkpoint_path``."""

    def __init__(self, node: str, driver: str, inventory: Callable[[], GpuInventory], read_claim: ClaimReader,
                 cdi: CdiSpecs, checkpoint_path: str, enforcement: Enforcement | None = None) -> None:
        self.node = node
        self.driver = driver
        self.pool = node
        self._inventory = inventory
        self._read_claim = read_claim
        self.cdi = cdi
        self.checkpoint_path = checkpoint_path
        self.enforcement: Enforcement = enforcement or NoEnforcement()
        self._claims: dict[str, PreparedClaim] = checkpoint.load(checkpoint_path)
        self._lock = asyncio.Lock()
        self.stats = ClaimStats()

    @property
    def claims(self) -> Mapping[str, PreparedClaim]:
        """UID → prepared claim, now."""
        return dict(self._claims)

    # ------------------------------------------------------------------ kubelet's calls
    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, list[PreparedDevice] | str]:
        """Prepare each claim; UID → its devices, or the reason it was refused (kubelet shows it)."""
        out: dict[str, list[PreparedDevice] | str] = {}
        async with self._lock:
            changed = False
            for ref in refs:
                started = time.perf_counter()
                try:
                    prepared, new = await self._prepare_one(ref)
                except (ClaimError, GrantError) as exc:
                    self.stats.refused += 1
                    log.error("refusing to prepare claim %s: %s", ref, exc)
                    out[ref.uid] = str(exc)
                    continue
                except Exception as exc:  # the API or the disk: kubelet retries the call
                    self.stats.refused += 1
                    log.exception("preparing claim %s failed", ref)
                    out[ref.uid] = f"preparing claim {ref} failed: {exc}"
                    continue
                changed |= new
                out[ref.uid] = devices_of(prepared)
                self.stats.prepare_ms.append((time.perf_counter() - started) * 1000.0)
            if changed:
                self._save()
        return out

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Unprepare each claim; UID → "" or the reason it failed."""
        out: dict[str, str] = {}
        async with self._lock:
            changed = False
            for ref in refs:
                started = time.perf_counter()
                try:
                    self.cdi.remove(ref.uid)
                except OSError as exc:
                    out[ref.uid] = f"removing the CDI spec of claim {ref}: {exc}"
                    continue
                if self._claims.pop(ref.uid, None) is not None:
                    changed = True
                    self.stats.unprepared += 1
                    log.info("unprepared claim %s", ref)
                out[ref.uid] = ""
                self.stats.unprepare_ms.append((time.perf_counter() - started) * 1000.0)
            if changed:
                self._save()
        return out

    # ------------------------------------------------------------------ one claim
    async def _prepare_one(self, ref: ClaimRef) -> tuple[PreparedClaim, bool]:
        known = self._claims.get(ref.uid)
        if known is not None:
            self.stats.repeated += 1
            if not self.cdi.exists(ref.uid):  # removed behind our back: write it again
                self.cdi.write(ref.uid, self._grant(self._allocation_of(known)))
            return known, False
        obj = await self._read_claim(ref.namespace, ref.name)
        if obj is None:
            raise ClaimError(f"claim {ref} does not exist")
        allocation = read_allocation(ref, obj, self.driver, self.pool)
        self._check_fits(allocation)
        cdi_id = self.cdi.write(ref.uid, self._grant(allocation))
        prepared = PreparedClaim(ref, allocation.pod, allocation.pod_uid, allocation.shares, cdi_id)
        self._claims[ref.uid] = prepared
        self.stats.prepared += 1
        log.info("prepared claim %s for pod %s/%s: %s", ref, *allocation.pod,
                 ", ".join(f"{s.device} {_amount(s.memory_mib)} {s.compute_percent}%" for s in allocation.shares))
        return prepared, True

    def _check_fits(self, allocation: ClaimAllocation) -> None:
        """Refuse a claim whose card is gone, or that would put more memory or compute on a card
        than it has next to the claims prepared already (a stale slice, a second allocator)."""
        inventory = self._inventory()
        for share in allocation.shares:
            try:
                card = inventory.card(share.card)
            except KeyError:
                raise ClaimError(f"claim {allocation.claim}: device {share.device} is not on node {self.node} "
                                 f"(the card vanished since the slice was published?)") from None
            if not card.healthy:
                raise ClaimError(f"claim {allocation.claim}: device {share.device} is unhealthy")
            capacity = memory_capacity_mib(card.memory_mib)
            held = [s for c in self._claims.values() for s in c.shares if s.card == share.card]
            memory = sum(capacity if s.memory_mib is None else s.memory_mib for s in (*held, share))
            compute = sum(s.compute_percent for s in (*held, share))
            if memory > capacity or compute > 100:
                raise ClaimError(f"claim {allocation.claim}: device {share.device} would hold {memory} MiB and "
                                 f"{compute}% with the {len(held)} claims prepared on it; it has {capacity} MiB, "
                                 f"100%")

    def _allocation_of(self, prepared: PreparedClaim) -> ClaimAllocation:
        return ClaimAllocation(prepared.claim, prepared.pod, prepared.pod_uid, prepared.shares)

    def _grant(self, allocation: ClaimAllocation) -> ContainerGrant:
        """The claim's container grant, built as an Allocate builds one: the claim stands for the
        container (``GPUPOOL_CONTAINER`` names the claim; a claim may serve several containers)."""
        inventory = self._inventory()
        slices = tuple(CardSlice(s.card, _memory(inventory, s.card, s.memory_mib),
                                 s.compute_percent * (COMPUTE_PER_CARD // 100)) for s in allocation.shares)
        container = allocation.claim.name
        assignment = ContainerAssignment(container, slices)
        pod_ns, pod_name = allocation.pod if allocation.pod[1] else (allocation.claim.namespace, "")
        view = PodView(pod_ns, pod_name, allocation.pod_uid, self.node, 0.0, False, (),
                       NodeAssignment(Placement(f"{pod_ns}/{pod_name}", self.node, 0, 0, (assignment,)), {}))
        return build_grant(f"{pod_ns}/{pod_name}", assignment, None, inventory,
                           self.enforcement.grant_extras(view, container))

    def _save(self) -> None:
        checkpoint.save(self.checkpoint_path, self._claims)


def devices_of(prepared: PreparedClaim) -> list[PreparedDevice]:
    """The prepare answer of a claim: every share, the claim's CDI device on the first one only (a
    container using the claim gets its grant once)."""
    return [PreparedDevice(s.request, s.pool, s.device, (prepared.cdi_id,) if i == 0 else (), s.share_id)
            for i, s in enumerate(prepared.shares)]


def _memory(inventory: GpuInventory, card: int, memory_mib: int | None) -> int:
    return memory_capacity_mib(inventory.card(card).memory_mib) if memory_mib is None else memory_mib


def _amount(memory_mib: int | None) -> str:
    return "whole card" if memory_mib is None else f"{memory_mib} MiB"
