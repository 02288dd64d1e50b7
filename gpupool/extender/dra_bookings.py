"""DRA claims in the extender's ledger: one ledger for claims and extended-resource pods (issue 24).

kube-scheduler's DRA allocator chooses cards for ResourceClaims of gpupool's driver without asking
the extender; the extender chooses cards for extended-resource pods without the allocator seeing
them. So that a cluster mixing both never books a card twice on the extender's side, every claim
allocated from gpupool's driver is booked here, in the same :class:`ClusterState` as the pods: its
shares (:func:`gpupool.kube.dra_claims.claim_shares`, the reading the node agent prepares from) on
the card of the node its pool names, the card found by its NVML index among the node's published
cards. The filter then sees what the claims hold as used, and quotas (per namespace, from the
ledger's usage tally) and the ledger's ``/metrics`` totals count it.

Why claims are booked with :meth:`ClusterState.claim` (not ``apply``): the allocator has decided and
the node prepares it; a claim that does not fit the ledger (an extended-resource pod got there
first) is the cluster's state, so it is booked beyond the card's capacity and reported as an
over-committed card (the node agent refuses to prepare it, see docs/dra.md, "One ledger"), never
hidden. A claim whose allocation cannot be read (or names a card its node does not publish) holds
something nobody knows: like a pod with an unreadable assignment it stops GPU placements on that
node, with the reason, until it is fixed or deleted.

Keys, records and placements: :mod:`gpupool.kube.claim_holding` (the kubectl plugin books claims
with the same reading).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpupool.core.model import NodeSpec, Placement
from gpupool.core.state import AllocationError, ClusterState
from gpupool.extender.booking_keeper import ASSUMED_CONFLICT, BookingKeeper
from gpupool.extender.victims import HeldClaim
from gpupool.kube.claim_asks import ClaimAsk, ClassSelection, claim_ask, class_names
from gpupool.kube.claim_holding import CLAIM_MARK, ClaimRecord, claim_booking, claim_key, read_claim
from gpupool.kube.device_selector import device_schema

log = logging.getLogger(__name__)

class ClaimBookings:
    """Every allocated claim of gpupool's driver, booked in the extender's ledger.

    Called under the cache's lock (:class:`gpupool.extender.cache.ClusterCache` owns one and feeds
    it from the claims' list+watch, :mod:`gpupool.extender.dra_watch`, and from node changes)."""

    def __init__(self, state: ClusterState, keeper: BookingKeeper, driver: str) -> None:
        self.state = state
        self.keeper = keeper
        """The pods' bookings: their problems (over-committed cards, unreadable claims) are the
        claims' too, and a claim ends the filter's assumptions it collides with."""
        self.problems = keeper.problems
        self.driver = driver
        self.spec_of: Callable[[str], NodeSpec | None] = keeper.spec_of
        self.pod_uid_of: Callable[[str], str] = keeper.uid_of
        self.records: dict[str, ClaimRecord] = {}
        self.required = False
        """Whether readiness waits for a first list of claims (the extender watches them)."""
        self.synced = False
        self.released = 0
        """Claims whose booking was given back (deallocated or deleted); the wake-up of refused
        pods watches it (:func:`gpupool.extender.wakeup.loosening_signature`)."""
        self._on_node: dict[str, set[str]] = {}
        self.classes = frozenset({driver})
        """gpupool's DeviceClasses: the one the chart and kustomize install is named after the driver,
        and with the DeviceClass watch (``--steer-claim-pods``) every class requiring the driver
        (:meth:`set_classes`)."""
        self.class_selections: dict[str, ClassSelection] = {}
        """What each of gpupool's classes' own selectors add to its requests' selection."""
        self.classes_synced = True
        """False while the DeviceClass watch has not listed yet (without it, only the driver's class)."""
        self._specs: dict[str, Mapping[str, Any]] = {}
        """Each claim as its ask reads it (metadata's name, spec, whether allocated): a class that
        changes is read again into the asks of the claims naming it."""
        self.schema = device_schema(driver)
        """What the claims' selectors may read of gpupool's devices (:mod:`gpupool.kube.device_selector`)."""
        self.asks: dict[str, ClaimAsk] = {}
        """What each claim watched asks of gpupool's cards, for the node choice of its pod before it
        is allocated (:mod:`gpupool.extender.claim_pods`)."""

    # ------------------------------------------------------------------------------- watch side
    def upsert(self, obj: Mapping[str, Any]) -> None:
        """An ADDED/MODIFIED claim: book what it holds now (nothing when it is not allocated)."""
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        key = claim_key(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        status = obj.get("status")
        allocated = isinstance(status, Mapping) and status.get("allocation") is not None
        slim = self._specs[key] = {"metadata": {"namespace": meta.get("namespace"), "name": meta.get("name")},
                                   "spec": obj.get("spec"), "status": {"allocation": {}} if allocated else {}}
        self.asks[key] = claim_ask(slim, self.classes, self.schema, self.class_selections)
        try:
            record = read_claim(obj, self.driver)
        except Exception as exc:  # a reading bug must not stop the watch or drop what the claim held
            log.exception("claim %s cannot be read", key)
            known = self.records.get(key)
            record = ClaimRecord(key, str(meta.get("uid") or ""), known.node if known else "",
                                 problem=f"claim {key.replace(CLAIM_MARK, '')} cannot be read: {exc}")
        self._set(key, record)

    def remove(self, obj: Mapping[str, Any]) -> None:
        """A DELETED claim: its shares are free again (a delete of an older claim of that name is
        ignored)."""
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        key = claim_key(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        known = self.records.get(key)
        uid = str(meta.get("uid") or "")
        if known is not None and uid and known.uid and known.uid != uid:
            return
        self.asks.pop(key, None)
        self._specs.pop(key, None)
        self._set(key, None)

    def replace(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """A full list: book every claim in it, release the rest."""
        seen: set[str] = set()
        for obj in objs:
            meta = obj.get("metadata")
            if isinstance(meta, Mapping):
                seen.add(claim_key(str(meta.get("namespace") or ""), str(meta.get("name") or "")))
            self.upsert(obj)
        for key in [k for k in self.records if k not in seen]:
            self._set(key, None)
        for key in [k for k in self.asks if k not in seen]:
            del self.asks[key]
            self._specs.pop(key, None)
        self.synced = True

    def set_classes(self, selections: Mapping[str, ClassSelection | None]) -> None:
        """gpupool's DeviceClasses now (each with what its selectors add, None: nothing): the asks
        of the claims naming a class that was added, removed or changed are read again, so nothing
        worked out for a class's old selectors is used after it changed."""
        classes = frozenset(selections)
        kept = {name: found for name, found in selections.items() if found is not None}
        changed = {name for name in classes ^ self.classes} | {
            name for name in classes | self.classes if kept.get(name) != self.class_selections.get(name)}
        self.classes, self.class_selections = classes, kept
        if not changed:
            return
        for key, slim in self._specs.items():
            if class_names(slim.get("spec")) & changed:
                self.asks[key] = claim_ask(slim, self.classes, self.schema, self.class_selections)

    def sync_node(self, node: str) -> None:
        """Node ``node`` arrived, changed or left: book its claims again (card positions may move)."""
        for key in sorted(self._on_node.get(node, ())):
            self._book(key)

    # ---------------------------------------------------------------------------------- reads
    def uid_of(self, key: str) -> str:
        """The claim's UID for a claim key, the pod's for a pod key."""
        record = self.records.get(key)
        return record.uid if record is not None else self.pod_uid_of(key)

    def booked(self) -> int:
        """Claims holding cards in the ledger now."""
        return sum(1 for key in self.records if key in self.state.placements)

    def held_on(self, node: str) -> list[HeldClaim]:
        """The claims on ``node`` (booked, or unreadable there) with the UIDs of the consumers they
        are reserved for: the preempt choice frees one when all of them are victims
        (:mod:`gpupool.extender.victims`)."""
        found: list[HeldClaim] = []
        for key in sorted(self._on_node.get(node, ())):
            placement = self.state.placements.get(key)
            if placement is not None and placement.node != node:
                continue
            cards = tuple(sorted(placement.held_per_card())) if placement is not None else ()
            found.append(HeldClaim(key, self.records[key].users, cards))
        return found

    # -------------------------------------------------------------------------------- booking
    def _set(self, key: str, record: ClaimRecord | None) -> None:
        old = self.records.get(key)
        if old == record:
            return
        if old is not None and old.node:
            self._on_node.get(old.node, set()).discard(key)
        if record is None:
            self.records.pop(key, None)
        else:
            self.records[key] = record
            if record.node:
                self._on_node.setdefault(record.node, set()).add(key)
        self._book(key)

    def _book(self, key: str) -> None:
        """Make the ledger hold what the claim's record says (nothing while its node is absent);
        a claim that held cards and holds none now is announced as released (the preemptor whose
        victims freed it is retried once it is: :mod:`gpupool.extender.requeue`)."""
        held = key in self.state.placements
        self._place(key)
        if held and key not in self.state.placements:
            self.keeper.on_release(key)

    def _place(self, key: str) -> None:
        record = self.records.get(key)
        desired: Placement | None = None
        problem: str | None = None
        if record is not None:
            desired, problem = claim_booking(record, self.spec_of(record.node) if record.node else None)
        if problem is not None and record is not None:
            self.problems.set_unreadable(key, record.uid, record.node or "(unknown node)", problem)
        else:
            self.problems.clear_unreadable(key)
        if self.state.placements.get(key) == desired:
            return
        self._release(key)
        if desired is None:
            return
        try:
            self.state.claim(desired)
        except AllocationError as exc:  # a card the node has no more: booked when it publishes it again
            log.error("claim %s: cannot book %s: %s", key, desired, exc)
            return
        log.info("claim %s: booked on node %s, %s", key, desired.node, _shown(desired))
        over = self.state.over_capacity(desired.node)
        if over:
            over = self._yield_assumptions(desired.node, over)
        if over or desired.node in self.problems.overcommitted:
            self.problems.cards_over(self.state, desired.node, over, self.uid_of)

    def _yield_assumptions(self, node: str, over: tuple[int, ...]) -> tuple[int, ...]:
        """End the filter's assumptions holding a card of ``node`` the claim took beyond its
        capacity (an assumption is the filter's guess, the claim the cluster's: the assumed pod's
        bind then decides again); the cards still over capacity afterwards."""
        row = self.state.index[node]
        cards = set(over)
        yielding = sorted(k for k in self.state.pods_on.get(row, ()) if k in self.keeper.assumptions
                          and cards.intersection(self.state.placements[k].held_per_card()))
        if not yielding:
            return over
        for key in yielding:
            self.keeper.unassume(key, ASSUMED_CONFLICT)
        self.state.upsert_node(self.state.specs[row])  # a release from a card over capacity: derive it again
        return self.state.over_capacity(node)

    def _release(self, key: str) -> None:
        placement = self.state.release(key)
        if placement is None:
            return
        log.info("claim %s: released on node %s", key, placement.node)
        self.released += 1
        node = placement.node
        if node in self.problems.overcommitted and node in self.state.index:
            # a release from an over-committed card does not restore its mode: derive the node again
            self.state.upsert_node(self.state.specs[self.state.index[node]])
            self.problems.cards_over(self.state, node, self.state.over_capacity(node), self.uid_of)


def _shown(placement: Placement) -> str:
    return ", ".join(f"card position {card}: {memory} MiB, {compute / 10:g} percent" + (" (whole)" if whole else "")
                     for card, (memory, compute, whole) in sorted(placement.held_per_card().items()))
