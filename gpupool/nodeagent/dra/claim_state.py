"""The one owner of what this node prepared for DRA claims: every prepare and unprepare goes
through :class:`ClaimState` (as the device plugin's calls go through the node agent).

Prepare reads the claim, checks it against the cards this node has and what other prepared claims
hold on them, builds the container grant with the same code an Allocate uses
(:func:`gpupool.nodeagent.container_grant.build_grant`, with the enforcement backend's extras),
writes the claim's CDI spec, then remembers the claim in the checkpoint. A repeated prepare of a
remembered claim answers the same devices without reading anything (kubelet retries; the agent
may have restarted). Unprepare removes the spec and forgets the claim; an unknown claim is already
unprepared. Bookkeeping is serialised by one lock, so a claim is checked against a settled view of
the cards; reading claims and writing files happen outside it. A call answers only once its
claims' CDI specs are written and the checkpoint holds its change; one writer
(:class:`~gpupool.nodeagent.dra.spec_batch.ClaimWriter`) writes both in a worker thread for all the
calls waiting, so the calls that arrive meanwhile share the next thread call (100 claims at once
cost a few thread hand-offs and checkpoint writes, not 100).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.core.card_rule import CardVerdict, Demand
from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.kube.card_device import memory_capacity_mib
from gpupool.nodeagent.container_grant import GrantError, build_grant
from gpupool.nodeagent.dra import checkpoint
from gpupool.nodeagent.dra.cdi import CdiSpecs
from gpupool.nodeagent.dra.checkpoint import PreparedClaim
from gpupool.nodeagent.dra.claim_allocation import ClaimAllocation, ClaimError, ClaimRef, read_allocation
from gpupool.nodeagent.dra.spec_batch import CheckpointNotWritten, ClaimWriter
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.isolation.backends import Enforcement, NoEnforcement
from gpupool.nodeagent.kept_ledger import KeptLedger
from gpupool.nodeagent.schedule_check import NodeLedger
from gpupool.nodeagent.types import ContainerGrant, NodeAssignment, PodView

log = logging.getLogger(__name__)

ClaimReader = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]
"""(namespace, name) → the ResourceClaim as JSON, ``None`` when it does not exist."""
HeldElsewhere = Callable[[], Iterable[PodView]]
"""The device plugin's pods holding grants on this node now
(:func:`gpupool.nodeagent.dra.plugin_holdings.plugin_pods`)."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepare answer (the DRA service's ``Device``)."""

    requests: tuple[str, ...]
    """The requests of the claim whose containers get this device's CDI ids (kubelet hands a
    container the CDI ids of the devices naming a request it references, or of all for the claim)."""
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
                 cdi: CdiSpecs, checkpoint_path: str, enforcement: Enforcement | None = None,
                 held_elsewhere: HeldElsewhere | None = None) -> None:
        self.node = node
        self.driver = driver
        self.pool = node
        self._inventory = inventory
        self._read_claim = read_claim
        self.cdi = cdi
        self.checkpoint_path = checkpoint_path
        self.enforcement: Enforcement = enforcement or NoEnforcement()
        self._held_elsewhere = held_elsewhere
        self._claims: dict[str, PreparedClaim] = checkpoint.load(checkpoint_path)
        self._lock = asyncio.Lock()
        self._version = 0
        """Bumped on every change of ``_claims``; the writer knows which version the file holds."""
        self._writer = ClaimWriter(lambda: self.cdi, checkpoint_path, lambda: (self._version, self._claims))
        """Writes the CDI specs and the checkpoint of concurrent calls together, in one thread call."""
        self.held = KeptLedger(node)
        """What check_fits asks, kept between prepares (rebuilt after an unprepare or a change)."""
        self.stats = ClaimStats()

    @property
    def claims(self) -> Mapping[str, PreparedClaim]:
        """UID → prepared claim, now."""
        return dict(self._claims)

    def as_pods(self) -> list[PodView]:
        """The prepared claims as the device plugin's check reads grants: one pod-like view per
        claim (named ``claim <name>``, its UID the claim's), holding its shares on this node; a
        share with no consumed memory holds the whole card. Safe from another thread (the lending
        rules read it on the event source's): it walks a copy of the claims."""
        inventory = self._inventory()
        return [self._view(prepared, inventory) for prepared in list(self._claims.values())]

    def _view(self, prepared: PreparedClaim, inventory: GpuInventory) -> PodView:
        """One prepared claim as a pod-like view (:meth:`as_pods`)."""
        slices = tuple(CardSlice(s.card, _memory(inventory, s.card, s.memory_mib),
                                 s.compute_percent * (COMPUTE_PER_CARD // 100), exclusive=s.memory_mib is None)
                       for s in prepared.shares)
        name = f"claim {prepared.claim.name}"
        placement = Placement(f"{prepared.claim.namespace}/{name}", self.node, 0, 0,
                              (ContainerAssignment(prepared.claim.name, slices),))
        return PodView(prepared.claim.namespace, name, prepared.claim.uid, self.node, 0.0, False, (),
                       NodeAssignment(placement, {}))

    # ------------------------------------------------------------------ kubelet's calls
    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, list[PreparedDevice] | str]:
        """Prepare each claim; UID → its devices, or the reason it was refused (kubelet shows it).

        Three steps, so that only bookkeeping waits for the lock: the claims not known yet are read
        from the API concurrently; under the lock each is checked and booked; then their CDI specs
        and the checkpoint are written by the one writer, with those of the other calls waiting.
        A claim whose spec could not be written is forgotten (its answer says why); one unprepared
        meanwhile has its spec removed again."""
        out: dict[str, list[PreparedDevice] | str] = {}
        fresh = [ref for ref in refs if ref.uid not in self._claims]
        objects = {ref.uid: obj for ref, obj in zip(fresh, await self._read_each(fresh), strict=True)}
        specs: list[tuple[PreparedClaim, ContainerGrant]] = []
        async with self._lock:
            for ref in refs:
                started = time.perf_counter()
                try:
                    prepared, grant = self._book(ref, objects.get(ref.uid))
                except (ClaimError, GrantError) as exc:
                    out[ref.uid] = self._refuse(ref, str(exc))
                    continue
                except Exception as exc:  # the API or the enforcement backend: kubelet retries the call
                    log.exception("preparing claim %s failed", ref)
                    out[ref.uid] = self._refuse(ref, f"preparing claim {ref} failed: {exc}")
                    continue
                if grant is not None:
                    specs.append((prepared, grant))
                out[ref.uid] = devices_of(prepared)
                self.stats.prepare_ms.append((time.perf_counter() - started) * 1000.0)
        not_saved: CheckpointNotWritten | None = None
        try:
            written = await self._writer.write([(p.claim.uid, g) for p, g in specs], self._version)
        except CheckpointNotWritten as exc:  # the claims whose spec failed are still forgotten
            not_saved, written = exc, exc.outcomes
        for (prepared, _), error in zip(specs, written, strict=True):
            if error is not None:
                out[prepared.claim.uid] = await self._unbook(prepared, error)
            elif prepared.claim.uid not in self._claims:  # unprepared while its spec was written
                with contextlib.suppress(OSError):
                    self.cdi.remove(prepared.claim.uid)
        if not_saved is not None:  # kubelet sees the call fail and calls again; the retry writes
            raise not_saved.error
        return out

    async def _read_each(self, refs: Sequence[ClaimRef]) -> list[Mapping[str, Any] | BaseException]:
        """Each claim read concurrently, or the exception its read raised. One claim (kubelet's
        usual call: one pod with one claim) is read in the calling task: ``gather`` would wrap it in
        a task of its own, which 100 concurrent calls pay 100 times on the loop receiving them."""
        if len(refs) == 1:
            try:
                return [await self._read(refs[0])]
            except Exception as exc:  # as gather(return_exceptions=True) would hand it back
                return [exc]
        return await asyncio.gather(*(self._read(ref) for ref in refs), return_exceptions=True)

    async def _read(self, ref: ClaimRef) -> Mapping[str, Any]:
        obj = await self._read_claim(ref.namespace, ref.name)
        if obj is None:
            raise ClaimError(f"claim {ref} does not exist")
        return obj

    def _refuse(self, ref: ClaimRef, reason: str) -> str:
        self.stats.refused += 1
        log.error("refusing to prepare claim %s: %s", ref, reason)
        return reason

    def _book(self, ref: ClaimRef, obj: Mapping[str, Any] | BaseException | None
              ) -> tuple[PreparedClaim, ContainerGrant | None]:
        """Under the lock: the claim as prepared, and the grant whose CDI spec must be written
        (``None`` when the spec is on disk already)."""
        known = self._claims.get(ref.uid)
        if known is not None:  # prepared before (or by a call that read it meanwhile)
            self.stats.repeated += 1
            if self.cdi.exists(ref.uid):
                return known, None
            return known, self._grant(self._allocation_of(known))  # removed behind our back
        if isinstance(obj, BaseException):
            raise obj
        if obj is None:
            raise ClaimError(f"claim {ref} was not read")
        allocation = read_allocation(ref, obj, self.driver, self.pool)
        self.check_fits(allocation)
        grant = self._grant(allocation)
        prepared = PreparedClaim(ref, allocation.pod, allocation.pod_uid, allocation.shares,
                                 self.cdi.device_id(ref.uid))
        self._claims[ref.uid] = prepared
        self.held.append(lambda inventory: self._view(prepared, inventory))
        self._version += 1
        self.stats.prepared += 1
        log.info("prepared claim %s for pod %s/%s: %s", ref, *allocation.pod,
                 ", ".join(f"{s.device} {_amount(s.memory_mib)} {s.compute_percent}%" for s in allocation.shares))
        return prepared, grant

    async def _unbook(self, prepared: PreparedClaim, error: BaseException) -> str:
        """Its CDI spec could not be written: forget the claim (kubelet calls again)."""
        async with self._lock:
            if self._claims.get(prepared.claim.uid) is prepared:
                del self._claims[prepared.claim.uid]
                self.held.forget()
                self._version += 1
        return self._refuse(prepared.claim, f"writing the CDI spec of claim {prepared.claim}: {error}")

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Unprepare each claim; UID → "" or the reason it failed."""
        out: dict[str, str] = {}
        async with self._lock:
            for ref in refs:
                started = time.perf_counter()
                try:
                    self.cdi.remove(ref.uid)
                except OSError as exc:
                    out[ref.uid] = f"removing the CDI spec of claim {ref}: {exc}"
                    continue
                if self._claims.pop(ref.uid, None) is not None:
                    self.held.forget()
                    self._version += 1
                    self.stats.unprepared += 1
                    log.info("unprepared claim %s", ref)
                out[ref.uid] = ""
                self.stats.unprepare_ms.append((time.perf_counter() - started) * 1000.0)
        try:
            await self._writer.write((), self._version)
        except CheckpointNotWritten as exc:
            raise exc.error from None
        return out

    # ------------------------------------------------------------------ one claim
    def check_fits(self, allocation: ClaimAllocation) -> None:
        """Refuse a claim whose card is gone or unhealthy, or that the core's card rule (the
        extender's, :mod:`gpupool.core.card_rule`) refuses beside what is held on this node: the
        claims prepared already and the device plugin's pods, claimed on a one-node ledger as the
        extender books them (:func:`gpupool.nodeagent.schedule_check.node_ledger`). Catches what a
        stale slice, a second allocator or an extended-resource pod the DRA allocator did not see
        would over-commit (docs/dra.md, "One ledger"). The ledger is kept between calls and
        rebuilt only when what it holds changed otherwise than by a prepare, or by a device plugin
        pod granted while no claim is prepared (:class:`~gpupool.nodeagent.kept_ledger.KeptLedger`,
        which the device plugin's Allocate keeps too)."""
        inventory = self._inventory()
        plugin = list(self._held_elsewhere()) if self._held_elsewhere is not None else []
        ledger = self.held.ledger(inventory, plugin, self.as_pods)
        for index in sorted({s.card for s in allocation.shares}):
            mine = [s for s in allocation.shares if s.card == index]
            device = mine[0].device
            pos = ledger.position(index)
            if pos is None:
                raise ClaimError(f"claim {allocation.claim}: device {device} is not on node {self.node} "
                                 f"(the card vanished since the slice was published?)")
            card = ledger.cards[pos]
            if not card.healthy:
                raise ClaimError(f"claim {allocation.claim}: device {device} is unhealthy")
            whole = any(s.memory_mib is None for s in mine)
            memory = sum(memory_capacity_mib(card.memory_mib) if s.memory_mib is None else s.memory_mib
                         for s in mine)
            compute = card.compute if whole else sum(s.compute_percent * (COMPUTE_PER_CARD // 100) for s in mine)
            demand = Demand(memory, compute, whole)
            verdict = ledger.state.card_verdict(NodeLedger.ROW, pos, demand)
            if verdict != CardVerdict.FITS:
                raise ClaimError(f"claim {allocation.claim}: {_refusal(ledger, pos, device, verdict, demand)}")

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


def devices_of(prepared: PreparedClaim) -> list[PreparedDevice]:
    """The prepare answer of a claim: every share, the claim's one CDI device (its grant) on the
    first only, so that a container using the claim gets it once. That first device names every
    request of the claim: a container that references a later request of a claim with several
    (``resources.claims[].request``) gets the grant too, where naming only the first share's
    request left it none. The grant is the whole claim's (its cards and shares, as for a container
    that references the claim itself)."""
    requests = tuple(dict.fromkeys(s.request for s in prepared.shares))
    return [PreparedDevice(requests if i == 0 else (s.request,), s.pool, s.device,
                           (prepared.cdi_id,) if i == 0 else (), s.share_id)
            for i, s in enumerate(prepared.shares)]


def _memory(inventory: GpuInventory, card: int, memory_mib: int | None) -> int:
    """A share's memory: what it consumed, or the whole card's (0 for a card no longer present)."""
    if memory_mib is not None:
        return memory_mib
    present = [c for c in inventory.cards if c.index == card]
    return memory_capacity_mib(present[0].memory_mib) if present else 0


def _amount(memory_mib: int | None) -> str:
    return "whole card" if memory_mib is None else f"{memory_mib} MiB"


def _refusal(ledger: NodeLedger, pos: int, device: str, verdict: CardVerdict, demand: Demand) -> str:
    """The card rule's refusal of ``demand`` on ``device`` (ledger position ``pos``), with what is
    held there and by whom."""
    card = ledger.cards[pos]
    at = (NodeLedger.ROW, pos)
    names = ", ".join(ledger.holders.get(pos, [])) or "nothing else"
    if verdict == CardVerdict.NOT_IDLE:
        return f"device {device} ({card.uuid}) is in use by {names}; a claim of the whole card needs it idle"
    if verdict == CardVerdict.EXCLUSIVE_HELD:
        return f"device {device} ({card.uuid}) is held whole by {names}"
    if verdict in (CardVerdict.NO_MEMORY, CardVerdict.NO_COMPUTE):
        total = int(ledger.state.card_mem_total[at])
        used = total - int(ledger.state.card_mem_free[at])
        used_milli = int(ledger.state.card_compute_total[at]) - int(ledger.state.card_compute_free[at])
        return (f"device {device} ({card.uuid}) would be over-committed: {int(demand.memory)} MiB and "
                f"{int(demand.compute) / 10:g}% asked, {used} MiB and {used_milli / 10:g}% of its {total} MiB, "
                f"100% held by {names}")
    return f"device {device} ({card.uuid}): {verdict.name.lower().replace('_', ' ')}"
