"""What the lending service writes into the interception library's regions (``--state-dir``) so that an
owner is never starved by its borrowers (Huanrong CN114675976B, case A).

- While a card is lent, each owner's region carries a wait bound for that card (the loan's owners and
  every container booked on the card, started or not: a region Allocate created is written before
  the library initialised it, and the library keeps the bound): an allocation within
  the owner's limit that the driver refuses for want of room is retried (every 5 ms) for up to the
  bound instead of failing: the room is a borrower's, and the agent reclaims it once it sees the
  owner back (its open within one /proc scan, or its activity). The bound is the checkpoint deadline
  plus :data:`OWNER_WAIT_MARGIN_S` (seeing the owner, stopping the borrower, the driver freeing its
  memory); it is cleared once the card is back and its reclaims are done, so a card that is really
  full fails at once again.
- When the owner comes back, every borrower being reclaimed is frozen on the card at once: its memory
  limit in its region drops to what it holds, so it allocates nothing more while it drains.

A container without a region (the library is not in it, or this node runs without it) is skipped:
nothing here is needed for the loan itself, it only keeps the owner's allocations from failing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from gpupool.api.shim_contract import REGION_FILE
from gpupool.nodeagent.isolation.shim_files import ShimFileError, ShimLayout
from gpupool.nodeagent.lending.pods import LendingPod
from gpupool.nodeagent.lending.rules import ContainerKey, PodKey
from gpupool.shim.region import RegionFormatError, freeze_memory, set_wait

log = logging.getLogger(__name__)

OWNER_WAIT_MARGIN_S = 5.0
"""Added to the checkpoint deadline for an owner's wait bound: the agent seeing the owner back (one
/proc scan, 1 s), the borrower killed at the deadline, the driver freeing its memory."""


class RegionControl:
    """Owners' wait bounds and borrowers' freezes in the containers' regions under ``state_dir``."""

    def __init__(self, state_dir: str, pod_of: Callable[[PodKey], LendingPod | None]) -> None:
        self._layout = ShimLayout(state_dir)
        self._pod_of = pod_of

    def set_owner_wait(self, owners: Iterable[ContainerKey], card: int, seconds: float) -> frozenset[ContainerKey]:
        """Let ``owners``' allocations on ``card`` wait up to ``seconds`` for room (0: not at all). Returns
        the owners whose region was there: written, or unwritable (logged once, not tried again); an
        owner without a region yet (Allocate creates it) is not among them, so the caller tries again."""
        written: set[ContainerKey] = set()
        for namespace, name, container in owners:
            found = self._region(self._pod_of((namespace, name)), container, card)
            if found is None:
                continue
            path, ordinal = found
            written.add((namespace, name, container))
            try:
                set_wait(path, ordinal, int(seconds * 1e9))
            except (OSError, RegionFormatError) as exc:
                log.warning("lending: cannot set the wait of %s/%s/%s on card %d: %s", namespace, name, container,
                            card, exc)
        return frozenset(written)

    def freeze(self, pod_key: PodKey, card: int) -> dict[str, int]:
        """Freeze every container of the pod on ``card`` (no new allocation); container → its limit now."""
        pod = self._pod_of(pod_key)
        frozen: dict[str, int] = {}
        for container in (pod.cards if pod is not None else {}):
            found = self._region(pod, container, card)
            if found is None:
                continue
            try:
                frozen[container] = freeze_memory(*found)
            except (OSError, RegionFormatError) as exc:
                log.warning("lending: cannot freeze %s/%s/%s on card %d: %s", *pod_key, container, card, exc)
        if frozen:
            log.info("lending: %s/%s frozen on card %d at %s bytes", *pod_key, card, frozen)
        return frozen

    def _region(self, pod: LendingPod | None, container: str, card: int) -> tuple[Path, int] | None:
        """The region file and CUDA ordinal of ``container``'s share of ``card`` (a DRA claim's is the
        claim's region, shared by the containers that use it)."""
        region = pod.region(container, card) if pod is not None else None
        if pod is None or region is None:
            return None
        try:
            path = Path(os.path.join(self._layout.container_dir(pod.uid, region[0]), REGION_FILE))
        except ShimFileError:
            return None
        return (path, region[1]) if path.exists() else None
