"""The node agent: answers kubelet's device-plugin calls and keeps the pods' annotations true.

It owns the allocation mapper, the device layout and the GPU inventory, and implements the device
plugin servers' handler. Kubernetes and kubelet are reached only through the ports in
:mod:`gpupool.nodeagent.types` (pod source, PodResources reader), so the same agent runs
against a real cluster, the fake kubelet of the tests and the benchmark.

Latency: Allocate and GetPreferredAllocation do one PodResources ``List`` (local unix socket) and
bookkeeping; a background writer writes the pod annotation, so no API round trip delays admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

from gpupool.api.names import ResourceNames
from gpupool.core.model import ContainerAssignment
from gpupool.nodeagent.allocation_mapper import AllocationMapper, MappingError, PodKey, ServedRecord
from gpupool.nodeagent.container_grant import GrantError, build_grant
from gpupool.nodeagent.device_layout import DeviceLayout
from gpupool.nodeagent.gpu_inventory import GpuBackend, GpuInventory, HealthEvent
from gpupool.nodeagent.isolation.backends import Enforcement, NoEnforcement
from gpupool.nodeagent.kept_ledger import KeptLedger
from gpupool.nodeagent.monitor.service import UsageMonitor
from gpupool.nodeagent.schedule_check import CardStateRefused, check_assignment, refuse_slices
from gpupool.nodeagent.served_container import ServedContainer
from gpupool.nodeagent.types import (
    ContainerGrant,
    PodResourcesReader,
    PodResourcesSnapshot,
    PodSource,
    PodView,
    StartRefused,
)

log = logging.getLogger(__name__)

#: How long GetPreferredAllocation waits for its PodResources read (else: the last snapshot).
PREFERRED_READ_S = 1.0

AllocatedEncoder = Callable[[str, datetime, list[ServedContainer]], str]
RefusalReporter = Callable[[PodKey, str], Coroutine[None, None, None]]
"""Tells a pod why its grant was refused (a Warning event; see :mod:`.schedule_check`)."""
ClaimsGranted = Callable[[], list[PodView]]
"""Grants made beside the device plugin on the same cards, as pods (the DRA driver's prepared claims)."""


def holder_of(snapshot: PodResourcesSnapshot, resource: str, device_ids: frozenset[str]) -> PodKey | None:
    """The pod kubelet lists with ``device_ids`` of ``resource`` in one of its containers (a device
    ID is held by one container at a time)."""
    for key, containers in snapshot.items():
        if any(devices.get(resource, frozenset()) & device_ids for devices in containers.values()):
            return key
    return None


class LentCapacity(Protocol):
    """Idle capacity this node lends to borrowers, as the agent consults it (the lending part,
    :class:`gpupool.nodeagent.lending.setup.LoanedCapacity`): handed to the agent when it is built."""

    def extra_devices(self, resource: str) -> list[tuple[str, bool]]:
        """The lent devices of ``resource`` served beside the cards' own: (ID, healthy)."""
        ...

    def vouch(self, pod: PodView, container: ContainerAssignment) -> bool:
        """True when ``pod`` is a borrower and ``container`` fits its loan (one that does not is refused
        with the reason); False: not a borrower, the owners' check (:func:`check_assignment`) decides."""
        ...

    def on_loan(self, pod: PodView) -> bool:
        """Whether a granted pod holds lent capacity: it counts against its loan, not against what
        owners are booked on its cards, so it never refuses an owner's grant."""
        ...

    def start_refusal(self, pod: PodView) -> str | None:
        """Why no container of ``pod`` may start now (its GPU is being or was reclaimed), or ``None``:
        asked before each container start, so kubelet does not restart a reclaimed pod's container."""
        ...


@dataclass
class AgentStats:
    """Counters the tests, the benchmark and metrics read."""

    bases: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    mismatches: int = 0
    released_pods: int = 0
    """Pods whose grants the agent dropped because kubelet no longer lists them (gone or replaced)."""
    allocate_ms: list[float] = field(default_factory=list)


class NodeAgent:
    """Implements :class:`gpupool.nodeagent.deviceplugin.server.AllocationHandler`."""

    def __init__(self, node: str, names: ResourceNames, backend: GpuBackend, pods: PodSource,
                 podresources: PodResourcesReader, encode_allocated: AllocatedEncoder,
                 poll_s: float = 0.5, aliases: tuple[str, ...] = (), monitor: UsageMonitor | None = None,
                 enforcement: Enforcement | None = None, report_refusal: RefusalReporter | None = None,
                 shares: bool = True, lent: LentCapacity | None = None,
                 claims_granted: ClaimsGranted | None = None) -> None:
        self.node = node
        self.names = names
        self.resources: tuple[str, ...] = (*names.all(), *aliases)
        """What this agent serves: gpupool's resources, then the opt-in foreign aliases."""
        self.shares = shares
        """Whether this node grants slices (parts of a card); false where nothing on the node could
        enforce a share (:mod:`gpupool.api.enforcement`): the extender places no slice here, and a
        stale one's is refused before Allocate (whole cards, by any resource name, still go)."""
        self.backend = backend
        self.pods = pods
        self.podresources = podresources
        self.layout = DeviceLayout(names)
        self.mapper = AllocationMapper(node)
        self.stats = AgentStats()
        self.poll_s = poll_s
        self._encode = encode_allocated
        self._inventory: GpuInventory = backend.inventory()
        self.granted_ledger = KeptLedger(node)
        """The schedule check's ledger of the granted pods, kept between Allocates."""
        self._version = 0
        self._changed = asyncio.Condition()
        self._snapshot: PodResourcesSnapshot = {}
        self._views: dict[PodKey, PodView] = {}
        self._served: dict[PodKey, dict[str, ServedContainer]] = {}
        self._dirty: set[PodKey] = set()
        self._wake_writer = asyncio.Event()
        self._writing = asyncio.Lock()
        self._fixed: set[tuple[str, frozenset[str]]] = set()
        self.monitor = monitor
        """The GPU usage monitor (started by the caller), or ``None`` when it is off."""
        self.enforcement: Enforcement = enforcement or NoEnforcement()
        """What holds containers to their shares on this node (adds env and mounts to grants)."""
        self._listed = False
        self._cordoned: dict[int, str] = {}
        self._report_refusal = report_refusal
        self.lent = lent
        """The lending part (``--lending``): lent devices in the device list, borrowers checked
        against their loans; ``None`` when this node lends nothing."""
        self.claims_granted = claims_granted
        """Grants made beside the device plugin on the same cards, as pods (the DRA driver's prepared
        claims, :meth:`gpupool.nodeagent.dra.claim_state.ClaimState.as_pods`): an Allocate is
        checked against them too, so the two paths never over-commit a card on this node. The
        metrics and the risk checks read it as well."""
        self._reports: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ devices and health
    @property
    def inventory(self) -> GpuInventory:
        return self._inventory

    @property
    def devices_version(self) -> int:
        return self._version

    def device_list(self, resource: str) -> list[tuple[str, bool]]:
        """(ID, healthy) for ListAndWatch."""
        devices = self.layout.devices(resource, self._inventory)
        if self.lent is not None:
            devices += self.lent.extra_devices(resource)
        return devices

    async def devices_changed(self) -> None:
        """Wake every ListAndWatch stream: the device list changed (health or lent capacity)."""
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    async def wait_devices_changed(self, seen_version: int) -> int:
        """Block until the device list changes (health event)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._version != seen_version)
            return self._version

    async def apply_health(self, event: HealthEvent) -> None:
        """A card's health changed: refresh inventory and wake every ListAndWatch stream."""
        log.warning("card %d %s: %s", event.card, "healthy" if event.healthy else "unhealthy", event.reason)
        await self._devices_changed()

    async def cordon(self, cards: Mapping[int, str]) -> None:
        """Report exactly these cards unhealthy whatever their backend says (risk isolation: kubelet
        and the extender grant nothing new there), the others as the backend says; card → reason."""
        if dict(cards) == self._cordoned:
            return
        for card in cards.keys() - self._cordoned.keys():
            log.warning("card %d cordoned: %s", card, cards[card])
        for card in self._cordoned.keys() - cards.keys():
            log.info("card %d no longer cordoned", card)
        self._cordoned = dict(cards)
        await self._devices_changed()

    async def _devices_changed(self) -> None:
        inventory = self.backend.inventory()
        self._inventory = replace(inventory, cards=tuple(
            replace(c, healthy=False) if c.index in self._cordoned else c for c in inventory.cards))
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    # ------------------------------------------------------------------ what metrics read
    def listed_pods(self) -> list[PodView]:
        """The pods kubelet listed at the last PodResources read, as the pod source described them."""
        return list(self._views.values())

    def prepared_claims(self) -> list[PodView]:
        """The DRA claims prepared on this node as pod-like views (:attr:`claims_granted`); none
        without the driver."""
        return self.claims_granted() if self.claims_granted is not None else []

    def live_pods(self) -> dict[str, PodKey] | None:
        """Pod UID → (namespace, name) of every pod kubelet listed at the last PodResources read;
        ``None`` before the first read or while a listed pod could not be read (its UID unknown)."""
        if not self._listed or any(key not in self._views for key in self._snapshot):
            return None
        return {view.uid: key for key, view in self._views.items()}

    def served_containers(self) -> int:
        """Containers of pods kubelet still lists whose Allocate this agent answered."""
        return sum(len(containers) for key, containers in self._served.items() if key in self._snapshot)

    # ------------------------------------------------------------------ kubelet calls
    async def _refresh(self) -> tuple[PodResourcesSnapshot, dict[PodKey, PodView]]:
        snapshot = await self.podresources.list()
        views: dict[PodKey, PodView] = {}
        for key in snapshot:
            view = await self.pods.get(*key)
            if view is not None:
                views[key] = view
        self._snapshot, self._views, self._listed = snapshot, views, True
        self.mapper.observe(snapshot, views)
        self._release_gone(snapshot)
        return snapshot, views

    def _release_gone(self, snapshot: PodResourcesSnapshot) -> None:
        """Drop what was served to pods kubelet no longer lists, once the mapper forgot them too
        (its grace covers a List taken mid-change): their grants no longer count, and no annotation
        is written to a pod that is gone."""
        kept = {record.pod_key for record in self.mapper.served()}
        for key in [k for k in self._served if k not in snapshot and k not in kept]:
            containers = self._served.pop(key)
            self._dirty.discard(key)
            self.stats.released_pods += 1
            log.info("released the grants of pod %s/%s (%s): kubelet no longer lists it", key[0], key[1],
                     ", ".join(sorted(containers)) or "no containers")

    async def preferred(self, resource: str, available: Sequence[str], must_include: Sequence[str],
                        size: int) -> list[str]:
        """Device IDs on the assigned cards of the container that comes next (advisory only).

        Reads PodResources first, like Allocate: kubelet 1.35-1.37 release the device-manager lock
        while they wait for this answer (G5) and already list the pod being admitted (G1). A read
        that takes over :data:`PREFERRED_READ_S` (a kubelet holding its lock) answers from the last
        snapshot."""
        snapshot, views = self._snapshot, self._views
        try:
            snapshot, views = await asyncio.wait_for(self._refresh(), PREFERRED_READ_S)
        except Exception as exc:  # advisory: answer from the last snapshot
            log.debug("GetPreferredAllocation answers from the last PodResources snapshot: %r", exc)
        cards: list[int] = []
        with contextlib.suppress(MappingError):
            res = self.mapper.resolve(resource, size, snapshot, views)
            cards = list(res.assignment.cards)
        return self.layout.prefer(available, must_include, size, cards)

    async def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerGrant:
        """Resolve the container, build its grant, log it, queue the annotation write."""
        started = time.perf_counter()
        ids = frozenset(device_ids)
        snapshot, views = await self._refresh()
        try:
            res = self.mapper.resolve(resource, len(ids), snapshot, views, ids, self.layout.card_of)
            if not self.shares:
                refuse_slices(res.assignment)
            if self.lent is None or not self.lent.vouch(res.pod, res.assignment):
                granted = self._granted(views, snapshot)
                if self.lent is not None:
                    granted = [p for p in granted if not self.lent.on_loan(p)]
                if self.claims_granted is not None:
                    granted = [*granted, *self.claims_granted()]
                check_assignment(self.node, self._inventory, res.pod, res.assignment, granted, self.granted_ledger)
            uuids = {s.card: self._inventory.card(s.card).uuid for s in res.assignment.slices
                     if any(c.index == s.card for c in self._inventory.cards)}
            grant = build_grant(f"{res.pod.namespace}/{res.pod.name}", res.assignment,
                                dict(res.pod.assignment.uuids) if res.pod.assignment else None,
                                self._inventory, self.enforcement.grant_extras(res.pod, res.container.name))
        except (MappingError, ValueError) as exc:
            self.stats.refused += 1
            log.error("refusing Allocate %s x%d: %s", resource, len(ids), exc)
            if isinstance(exc, GrantError):  # the pod is known: tell it why, without delaying kubelet
                report = asyncio.create_task(self._report(res.pod.key, str(exc)))
                self._reports.add(report)
                report.add_done_callback(self._reports.discard)
            if isinstance(exc, CardStateRefused):
                log.warning("the assignment was decided from a stale view of the cards; publishing them again")
                await self._devices_changed()
            raise
        record = self.mapper.record(res, resource, ids, tuple(uuids[s.card] for s in res.assignment.slices))
        self.stats.bases[res.basis] += 1
        if res.basis == "ambiguous":
            log.warning("Allocate %s x%d resolved by tie-break to %s/%s/%s among %d candidates",
                        resource, len(ids), res.pod.namespace, res.pod.name, res.container.name,
                        res.candidates)
        self._note_served(res.pod.key, record, resource, len(ids))
        self.stats.allocate_ms.append((time.perf_counter() - started) * 1000.0)
        return grant

    async def _report(self, pod: PodKey, reason: str) -> None:
        if self._report_refusal is not None:
            try:
                await self._report_refusal(pod, reason)
            except Exception as exc:  # the refusal stands; only its event is lost
                log.warning("could not report the refusal on %s/%s: %s", pod[0], pod[1], exc)

    def _granted(self, views: Mapping[PodKey, PodView], snapshot: PodResourcesSnapshot) -> list[PodView]:
        """Listed pods holding grants on this node: served by this agent, or by an earlier one
        (their ``allocated-v1``), and still holding devices by kubelet's account.

        Why kubelet's devices too: kubelet frees the devices of a pod whose containers ended (it
        knows first; the pod's phase reaches the API and this agent's pod watch later), and a grant
        whose devices kubelet gave back is dead: it must not refuse the pod that gets them next.
        """
        return [view for key, view in views.items()
                if (self._served_to(key, view) or view.allocated) and self._holds_devices(view, snapshot)]

    def _served_to(self, key: PodKey, view: PodView) -> bool:
        """Whether this agent served ``view`` itself (not an earlier pod of the same name)."""
        containers = self._served.get(key, {})
        return any(c.record.uid == view.uid for c in containers.values())

    def _holds_devices(self, view: PodView, snapshot: PodResourcesSnapshot) -> bool:
        """False when the pod's app containers (native sidecars included) hold GPU slices but kubelet
        lists none of its devices (PodResources lists both: a pod granted through regular init
        containers alone counts by its phase)."""
        if view.assignment is None or not any(c.slices for c in view.assignment.placement.containers
                                              if not c.init):
            return True
        listed = snapshot.get(view.key, {})
        return any(ids for devices in listed.values() for resource, ids in devices.items()
                   if resource in self.resources)

    async def pre_start(self, resource: str, device_ids: Sequence[str]) -> None:
        """Before a container starts (each start, restarts too) its device IDs are in PodResources:
        check who holds them, and refuse the start of a container whose pod's GPU the lending side
        is reclaiming or reclaimed (:class:`StartRefused`; kubelet retries it with its back-off until
        the eviction reaches it)."""
        snapshot, views = await self._refresh()
        self._reconcile(snapshot)
        if self.lent is None or not device_ids:
            return
        holder = holder_of(snapshot, resource, frozenset(device_ids))
        view = views.get(holder) if holder is not None else None
        reason = self.lent.start_refusal(view) if view is not None else None
        if view is not None and reason is not None:
            log.warning("refusing to start a container of %s/%s: %s", view.namespace, view.name, reason)
            raise StartRefused(f"gpupool: pod {view.namespace}/{view.name}: {reason}")

    # ------------------------------------------------------------------ annotations
    def _note_served(self, key: PodKey, record: ServedRecord, resource: str, count: int) -> None:
        containers = self._served.setdefault(key, {})
        if any(c.record.uid != record.uid for c in containers.values()):
            containers.clear()  # an earlier pod of the same name: its grants ended with it
        entry = containers.get(record.container)
        if entry is None or entry.record.slices != record.slices:
            entry = ServedContainer(record.container, record.init, record)
            containers[record.container] = entry
        entry.resources[resource] = count
        self._dirty.add(key)
        self._wake_writer.set()

    def _reconcile(self, snapshot: PodResourcesSnapshot) -> None:
        for mismatch in self.mapper.mismatches(snapshot):
            rec = mismatch.record
            marker = (rec.resource, rec.device_ids)
            if marker in self._fixed:
                continue
            self._fixed.add(marker)
            self.stats.mismatches += 1
            log.warning("kubelet gave %s of %s/%s to %s/%s; recording the truth", rec.resource,
                        rec.pod_key[1], rec.container, mismatch.holder[1], mismatch.holder_container)
            wrong = self._served.get(rec.pod_key, {})
            entry = wrong.pop(rec.container, None)
            self._dirty.add(rec.pod_key)
            truth = self._served.setdefault(mismatch.holder, {})
            holder = self._views.get(mismatch.holder)  # the holder may be a native sidecar:
            init = any(c.init for c in holder.containers if c.name == mismatch.holder_container) if holder else False
            moved = ServedContainer(mismatch.holder_container, init, rec,
                                    dict(entry.resources) if entry else {rec.resource: len(rec.device_ids)})
            truth[mismatch.holder_container] = moved
            self._dirty.add(mismatch.holder)
        self._wake_writer.set()

    def allocated_annotation(self, key: PodKey) -> str:
        """The ``allocated-v1`` value for a pod as the agent knows it now."""
        containers = list(self._served.get(key, {}).values())
        return self._encode(self.node, datetime.now(UTC), containers)

    async def flush(self) -> None:
        """Write every pending ``allocated-v1`` annotation now.

        One flush at a time (the background writer's and a caller's): two patches of one pod in
        flight together can reach the apiserver in either order, and an older value landing last
        would erase a container already served.
        """
        async with self._writing:
            while self._dirty:
                key = self._dirty.pop()
                try:
                    await self.pods.annotate(*key, {self.names.allocated:
                                                    self.allocated_annotation(key)})
                except Exception as exc:  # the API may be briefly away; retry on the next wake-up
                    log.error("annotating %s/%s failed: %s", key[0], key[1], exc)
                    self._dirty.add(key)
                    raise

    # ------------------------------------------------------------------ background work
    async def _writer(self) -> None:
        while True:
            await self._wake_writer.wait()
            self._wake_writer.clear()
            try:
                await self.flush()
            except Exception:
                await asyncio.sleep(1.0)
                self._wake_writer.set()

    async def _poller(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                snapshot, _ = await self._refresh()
                self._reconcile(snapshot)
            except Exception as exc:
                log.debug("PodResources poll failed: %s", exc)

    async def _health(self) -> None:
        async for event in self.backend.health_events():
            await self.apply_health(event)

    async def run(self) -> None:
        """Health watching, annotation writing, PodResources polling, usage sampling and the
        enforcement backend's work, until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._writer())
            group.create_task(self._poller())
            group.create_task(self._health())
            group.create_task(self.enforcement.run(self.live_pods))
            if self.monitor is not None:
                group.create_task(self.monitor.run())

