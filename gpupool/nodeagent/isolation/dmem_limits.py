"""Per-container device-memory limits through the kernel's ``dmem`` controller.

At Allocate the node's backend hands each container's grant here (:meth:`DmemLimiter.want`): every
card of the grant with a memory share gets an entry, refused at once when the card's region is not
in ``dmem.capacity`` (no PCI address from NVML, or a driver that does not charge this card to
``dmem``); the rest wait for the container's cgroup. Each pass (:meth:`DmemLimiter.apply`) finds
the cgroups of waiting containers (:func:`~gpupool.nodeagent.isolation.dmem_cgroups.container_cgroups`)
and writes ``dmem.max`` there. The container's cgroup, not the pod's: the grant is per container,
and the pod's cgroup would let one container take its sibling's share; the pod's cgroup only gets
``+dmem`` in its ``cgroup.subtree_control``, which the container's file needs.

A limit stays in the kernel after an agent restart (the cgroup keeps it); a container restarted
in a new cgroup is found again on the next pass (its applied entry goes back to waiting when the
old cgroup is gone). Entries of pods kubelet no longer lists are dropped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from gpupool.nodeagent.containers.container_directory import ContainerDirectory
from gpupool.nodeagent.isolation.dmem import DmemStatus, PciAddressError
from gpupool.nodeagent.isolation.dmem_cgroups import DmemWriteError, container_cgroups, write_limit
from gpupool.nodeagent.types import PodView

log = logging.getLogger(__name__)

BYTES_PER_MIB = 1 << 20


class LimitState(StrEnum):
    """Where one container's limit on one card stands."""

    APPLIED = "applied"
    WAITING = "waiting"
    """No cgroup of the container found yet (not started, or its id not yet in a pod status)."""
    REFUSED = "refused"
    """The card has no region in ``dmem.capacity``; never retried."""
    FAILED = "failed"
    """Writing failed (retried every pass)."""


@dataclass(frozen=True)
class DmemLimit:
    """One container's ``dmem.max`` on one card."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    card: int
    limit_bytes: int
    region: str
    state: LimitState
    detail: str = ""
    cgroup: str = ""


@dataclass(frozen=True)
class CardRegion:
    """A card's ``dmem`` region (``""`` when it has none, and why)."""

    card: int
    region: str
    reason: str = ""


@dataclass(frozen=True)
class DmemReport:
    """What ``/metrics`` and ``/usage`` show: each card's region, each container's limits."""

    cards: tuple[CardRegion, ...]
    limits: tuple[DmemLimit, ...]


LimitKey = tuple[str, str, int]  # pod UID, container, card


def card_regions(status: DmemStatus, pci_bus_ids: Mapping[int, str]) -> dict[int, CardRegion]:
    """Card index → its region in ``dmem.capacity``, or the reason it has none."""
    found = {}
    for card, bus_id in pci_bus_ids.items():
        if not bus_id:
            found[card] = CardRegion(card, "", "NVML gave no PCI address for the card")
            continue
        try:
            region = status.card_region(bus_id)
        except PciAddressError as exc:
            found[card] = CardRegion(card, "", str(exc))
            continue
        if region is None:
            found[card] = CardRegion(card, "", f"no region of {bus_id} in dmem.capacity")
        else:
            found[card] = CardRegion(card, region.name)
    return found


class DmemLimiter:
    """Keeps ``dmem.max`` of every granted container's cgroup at its grant's memory per card."""

    def __init__(self, status: DmemStatus, pci_bus_ids: Mapping[int, str], directory: ContainerDirectory,
                 root: str) -> None:
        self.status = status
        self.regions = card_regions(status, pci_bus_ids)
        self._directory = directory
        self._root = root
        self._limits: dict[LimitKey, DmemLimit] = {}

    def want(self, pod: PodView, container: str) -> None:
        """Record the limits of one container's grant (idempotent: Allocate runs once per resource)."""
        assignment = pod.assignment.container(container) if pod.assignment is not None else None
        if assignment is None:
            return
        for piece in assignment.slices:
            key = (pod.uid, container, piece.card)
            if piece.memory_mib <= 0 or key in self._limits:
                continue
            region = self.regions.get(piece.card, CardRegion(piece.card, "", "the card is not in the inventory"))
            state, detail = (LimitState.WAITING, "") if region.region else (LimitState.REFUSED, region.reason)
            limit = DmemLimit(pod.namespace, pod.name, pod.uid, container, piece.card, piece.memory_mib * BYTES_PER_MIB,
                              region.region, state, detail)
            self._limits[key] = limit
            if state is LimitState.REFUSED:
                log.warning("%s/%s/%s card %d: memory not limited by dmem: %s", pod.namespace, pod.name,
                            container, piece.card, detail)

    def forget_gone(self, live_pod_uids: set[str]) -> None:
        """Drop the entries of pods kubelet no longer lists."""
        self._limits = {k: v for k, v in self._limits.items() if k[0] in live_pod_uids}

    def apply(self) -> int:
        """One pass: write the limits whose container's cgroup is now known; how many were written."""
        for key, limit in self._limits.items():
            if limit.state is LimitState.APPLIED and not os.path.isdir(limit.cgroup):
                self._limits[key] = replace(limit, state=LimitState.WAITING, cgroup="",
                                            detail="its cgroup is gone (container restarted?)")
        pending = [k for k, v in self._limits.items() if v.state in (LimitState.WAITING, LimitState.FAILED)]
        if not pending:
            return 0
        cgroups = self._locate({(self._limits[k].namespace, self._limits[k].pod, k[1]) for k in pending})
        written = 0
        for key in pending:
            limit = self._limits[key]
            cgroup = cgroups.get((limit.namespace, limit.pod, limit.container, limit.pod_uid))
            if cgroup is None:
                continue
            try:
                write_limit(self._root, cgroup, limit.region, limit.limit_bytes)
            except DmemWriteError as exc:
                self._limits[key] = replace(limit, state=LimitState.FAILED, detail=str(exc), cgroup=cgroup)
                log.error("%s/%s/%s card %d: %s", limit.namespace, limit.pod, limit.container, limit.card, exc)
                continue
            self._limits[key] = replace(limit, state=LimitState.APPLIED, detail="", cgroup=cgroup)
            written += 1
            log.info("%s/%s/%s card %d: dmem.max %s %d in %s", limit.namespace, limit.pod, limit.container,
                     limit.card, limit.region, limit.limit_bytes, cgroup)
        return written

    def _locate(self, wanted: set[tuple[str, str, str]]) -> dict[tuple[str, str, str, str], str]:
        """(namespace, pod, container, pod UID) → cgroup directory, for the wanted containers."""
        found: dict[tuple[str, str, str, str], str] = {}
        for cgroup in container_cgroups(self._root):
            ref = self._directory.container(cgroup.container_id)
            if ref is None or (ref.namespace, ref.pod, ref.container) not in wanted:
                continue
            uids = {k[0] for k, v in self._limits.items()
                    if (v.namespace, v.pod, v.container) == (ref.namespace, ref.pod, ref.container)}
            for uid in uids:
                if not cgroup.pod_uid or cgroup.pod_uid == uid:  # a pod recreated under the same name
                    found[(ref.namespace, ref.pod, ref.container, uid)] = cgroup.path
        return found

    def report(self) -> DmemReport:
        """Regions per card and the limits, in a stable order."""
        cards = tuple(self.regions[c] for c in sorted(self.regions))
        limits = tuple(sorted(self._limits.values(), key=lambda v: (v.namespace, v.pod, v.container, v.card)))
        return DmemReport(cards, limits)
