"""Keeps the ledger equal to what every pod's booking holds.

Why apart from the cache: the cache (:mod:`gpupool.extender.cache`) turns API objects into pod
records and node specs; this module turns records, binder calls and the clock into events for
each pod's booking (:mod:`gpupool.extender.bookings`) and books in the :class:`ClusterState`
whatever the resulting stage holds. Claims the cluster already holds are booked even beyond a
card's capacity (:meth:`ClusterState.claim`); the binder's own reservations are checked
(:meth:`ClusterState.apply`). Conflicts go to :class:`BookingProblems`.

Not thread-safe on its own: the cache calls it under its lock.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping

from gpupool.api.annotations import AnnotationError, Assignment
from gpupool.core.groups import scope_of
from gpupool.core.model import NodeSpec, Placement, PodRequest
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import AllocationError, ClusterState
from gpupool.extender.booking_problems import BookingProblems
from gpupool.extender.bookings import (
    IDLE,
    PIN_SECONDS,
    Booking,
    BookingError,
    Event,
    Pin,
    Stage,
    advance,
    observe,
)
from gpupool.kube.pod_holding import PodRecord

log = logging.getLogger(__name__)

ENDED_DELETED = "deleted"
ENDED_FINISHED = "finished"
"""Succeeded or Failed: its containers exited, or kubelet refused it (an admission error)."""
ENDED_CLEARED = "cleared"
"""Still there, but holds nothing any more (its assignment was removed, it asks for no GPU)."""
RELEASE_REASONS = (ENDED_DELETED, ENDED_FINISHED, ENDED_CLEARED)


class BookingKeeper:
    """Every pod's :class:`Booking`, the pins of committed binds, and the ledger they are booked in."""

    def __init__(self, state: ClusterState, pods: Mapping[str, PodRecord], *, clock: Callable[[], float],
                 unconfirmed_timeout_s: float, on_release: Callable[[str], None] = lambda _key: None) -> None:
        self.state = state
        self.on_release = on_release
        """Told the key of every pod whose end released its booking (under the cache's lock)."""
        self.pods = pods
        self.clock = clock
        self.unconfirmed_timeout_s = unconfirmed_timeout_s
        self.bookings: dict[str, Booking] = {}
        self.problems = BookingProblems()
        self.pins: dict[str, Pin] = {}
        self._on_node: dict[str, set[str]] = {}
        self._nodes_of: dict[str, frozenset[str]] = {}
        self.released: Counter[str] = Counter()
        """Bookings given back because the pod ended, by how (:data:`RELEASE_REASONS`; metrics)."""

    def spec_of(self, name: str) -> NodeSpec | None:
        """The spec of a present node."""
        row = self.state.index.get(name)
        if row is None or not self.state.present[row]:
            return None
        return self.state.specs[row]

    # ------------------------------------------------------------------------------ watch side
    def sync(self, key: str) -> None:
        """Feed the booking of ``key`` what its latest pod record (and pin) says now."""
        pin = self.pins.get(key)
        record = self.pods.get(key)
        seen = observe(record, pin, now=self.clock(),
                       unconfirmed_timeout_s=self.unconfirmed_timeout_s, spec_of=self.spec_of)
        if pin is not None and seen.event is not Event.SEEN_BEHIND:
            del self.pins[key]  # shown by the watch, ended with the pod, or out of time
        held = self.state.placements.get(key)
        self._fire(key, seen.event, seen.placement, seen.problem)
        if held is not None and key not in self.state.placements and seen.event is Event.SEEN_NOTHING:
            self._count_release(key, held, record)
        if pin is not None and seen.event is Event.TIMED_OUT:
            self.sync(key)  # what the API says, now that the pin is gone

    def sync_node(self, name: str) -> None:
        """Re-sync every pod whose booking depends on node ``name`` (it arrived, changed or left)."""
        if self.spec_of(name) is None:
            self.problems.cards_over(self.state, name, (), self.uid_of)
        for key in sorted(self._on_node.get(name, ())):
            self.sync(key)

    def _count_release(self, key: str, held: Placement, record: PodRecord | None) -> None:
        """Count and log a booking the pod's end (or its cleared assignment) just gave back."""
        reason = ENDED_DELETED if record is None else ENDED_FINISHED if record.finished else ENDED_CLEARED
        self.released[reason] += 1
        log.info("pod %s %s: released its booking on node %s (cards %s)", key, reason, held.node,
                 sorted({s.card for c in held.containers for s in c.slices}))
        self.on_release(key)

    def forget_pin(self, key: str) -> None:
        """The pod is gone: nothing is left for its pin to hold."""
        self.pins.pop(key, None)

    def expire(self) -> list[str]:
        """Re-evaluate unbound assignments and pins against the clock; returns pods whose booking ended."""
        keys = [k for k, r in self.pods.items() if r.assignment is not None and not r.node_name]
        ended: list[str] = []
        for key in sorted({*keys, *self.pins}):
            had = key in self.state.placements
            self.sync(key)
            if had and key not in self.state.placements:
                ended.append(key)
        return ended

    # ----------------------------------------------------------------------------- binder side
    def reserve(self, request: PodRequest, node: str, scheduler: Scheduler, *,
                check: Callable[[Placement], str | None] | None = None,
                borrow: Callable[[PodRequest, str], Placement | Unschedulable] | None = None,
                ) -> Placement | Unschedulable:
        """Choose the cards for a bind in flight and book them (see :meth:`ClusterCache.reserve`).

        ``check``: a last word on the chosen placement (the pod's quotas), asked after the pod's
        previous booking is lifted and before the new one is booked, in this one step. ``borrow``:
        the choice on lent capacity when no owned capacity holds the pod (:mod:`gpupool.extender.borrowing`)."""
        key = request.key
        refused = self.problems.refused_nodes.get(node)
        if refused is not None and request.wants_gpu:
            return Unschedulable(key, refused)
        previous = self._release(key)
        decision = scheduler.assign(request, node)
        if isinstance(decision, Unschedulable) and borrow is not None:
            lent = borrow(request, node)
            decision = lent if isinstance(lent, Placement) else Unschedulable(key, f"{decision.reason}; {lent.reason}")
        if isinstance(decision, Placement) and check is not None:
            reason = check(decision)
            if reason is not None:
                decision = Unschedulable(key, reason)
        if isinstance(decision, Placement):
            try:
                self.state.apply(decision, scope_of(request))
            except AllocationError as exc:  # assign() checked it under the lock; kept as a guard
                decision = Unschedulable(key, str(exc))
            else:
                self._fire(key, Event.RESERVE, decision)
                return decision
        if previous is not None:
            self._book(key, previous)
        return decision

    def commit(self, key: str, assignment: Assignment) -> None:
        """Pin what the bind wrote (see :meth:`ClusterCache.commit`)."""
        booking = self.bookings.get(key, Booking())
        placement = booking.placement if booking.stage is Stage.RESERVED else None
        spec = self.spec_of(assignment.node)
        if placement is None and spec is not None:
            record = self.pods.get(key)
            try:
                placement = assignment.to_placement(key, spec, record.cpu_milli if record else 0,
                                                    record.memory_mib if record else 0)
            except AnnotationError as exc:
                log.error("pod %s: committed assignment cannot be booked: %s", key, exc)
        if placement is None:
            log.error("pod %s: commit of an assignment for node %s, which the ledger does not have",
                      key, assignment.node)
            return
        self.pins[key] = Pin(placement, assignment, self.clock() + PIN_SECONDS)
        self._fire(key, Event.COMMIT, placement)
        self.sync(key)

    def rollback(self, key: str) -> None:
        """Give the reservation back and book what the API last said instead."""
        self._fire(key, Event.ROLLBACK)
        self.sync(key)

    def in_flight(self) -> int:
        """Binds currently holding a reservation."""
        return sum(1 for b in self.bookings.values() if b.stage is Stage.RESERVED)

    # --------------------------------------------------------------------------------- booking
    def _fire(self, key: str, event: Event, placement: Placement | None = None,
              problem: str | None = None) -> None:
        old = self.bookings.get(key, Booking())
        try:
            new = advance(old, event, placement, problem)
        except BookingError as exc:
            log.error("pod %s: %s; booking kept as it is", key, exc)
            return
        if new.stage in IDLE and key not in self.pods and key not in self.pins:
            self.bookings.pop(key, None)
        else:
            self.bookings[key] = new
        if new.stage is Stage.UNREADABLE and new.placement is not None:
            self.problems.set_unreadable(key, self.uid_of(key), new.placement.node, new.problem or "")
        else:
            self.problems.clear_unreadable(key)
        self._index(key)
        self._book(key, new.placement)

    def _index(self, key: str) -> None:
        """Remember which nodes the pod's booking depends on, so a node's arrival or change re-syncs it."""
        record, pin, booking = self.pods.get(key), self.pins.get(key), self.bookings.get(key)
        nodes = {record.node_name, record.assignment.node if record.assignment else ""} if record else set()
        if pin is not None:
            nodes.add(pin.placement.node)
        if booking is not None and booking.placement is not None:
            nodes.add(booking.placement.node)
        nodes.discard("")
        before = self._nodes_of.get(key, frozenset())
        for gone in before - nodes:
            self._on_node.get(gone, set()).discard(key)
        for node in nodes - before:
            self._on_node.setdefault(node, set()).add(key)
        if nodes:
            self._nodes_of[key] = frozenset(nodes)
        else:
            self._nodes_of.pop(key, None)

    def _book(self, key: str, desired: Placement | None) -> None:
        """Make the ledger hold ``desired`` for ``key`` (nothing while its node is absent)."""
        if desired is not None and self.spec_of(desired.node) is None:
            desired = None  # booked when the node arrives (the pod is indexed under it)
        if self.state.placements.get(key) == desired:
            return
        self._release(key)
        if desired is not None:
            try:
                over = self.state.claim(desired)
            except AllocationError as exc:
                log.error("pod %s: cannot book %s: %s", key, desired, exc)
                return
            if over or desired.node in self.problems.overcommitted:
                self.problems.cards_over(self.state, desired.node, over, self.uid_of)

    def _release(self, key: str) -> Placement | None:
        placement = self.state.release(key)
        if placement is not None and placement.node in self.problems.overcommitted:
            # a release from an over-committed card does not restore its mode: derive the node again
            node = placement.node
            self.state.upsert_node(self.state.specs[self.state.index[node]])
            self.problems.cards_over(self.state, node, self.state.over_capacity(node), self.uid_of)
        return placement

    def uid_of(self, key: str) -> str:
        """The uid of a known pod ("" when it is not known)."""
        record = self.pods.get(key)
        return record.uid if record is not None else ""
