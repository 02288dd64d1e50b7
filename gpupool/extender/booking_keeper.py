"""Keeps the ledger equal to what every pod's booking holds.

Why apart from the cache: the cache (:mod:`gpupool.extender.cache`) turns API objects into pod
records and node specs; this module turns records, binder calls and the clock into events for
each pod's booking (:mod:`gpupool.extender.bookings`) and books in the :class:`ClusterState`
whatever the resulting stage holds. Claims the cluster already holds are booked even beyond a
card's capacity (:meth:`ClusterState.claim`); the binder's own reservations and the filter's
assumptions are checked (:meth:`ClusterState.apply`). Conflicts go to :class:`BookingProblems`.

An assumption is the filter's choice, not a claim: it yields to the cluster's claims (a claim that
would over-commit a card an assumption holds ends the assumption rather than report a conflict),
it ends after its deadline (:meth:`BookingKeeper.drop_lapsed`), and the bind of its pod takes it
over as its reservation when the bind is of the same request on the same node.

Not thread-safe on its own: the cache calls it under its lock.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpupool.api.annotations import AnnotationError, Assignment
from gpupool.core.groups import scope_of
from gpupool.core.model import NodeSpec, Placement, PodRequest
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import AllocationError, ClusterState
from gpupool.extender.booking_problems import BookingProblems
from gpupool.extender.bookings import (
    HOLDING,
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

ASSUMED_RESERVED = "reserved"
"""The pod's bind took the assumption over on its node (the usual end)."""
ASSUMED_MOVED = "moved"
"""The pod's bind reserved on another node."""
ASSUMED_REPLACED = "replaced"
"""A later filter of the pod decided again."""
ASSUMED_REFUSED = "refused"
"""The pod's bind ended without a reservation (refused, or not this replica's to do)."""
ASSUMED_EXPIRED = "expired"
"""No bind came before the deadline."""
ASSUMED_POD_ENDED = "pod_ended"
"""The pod was deleted or finished, or its node left."""
ASSUMED_SEEN = "seen"
"""The watch showed the pod bound or annotated by a writer (another replica's bind, say)."""
ASSUMED_CONFLICT = "conflict"
"""A claim of the cluster needed the assumed cards."""
ASSUMPTION_ENDS = (ASSUMED_RESERVED, ASSUMED_MOVED, ASSUMED_REPLACED, ASSUMED_REFUSED, ASSUMED_EXPIRED,
                   ASSUMED_POD_ENDED, ASSUMED_SEEN, ASSUMED_CONFLICT)


def pinned_elsewhere(key: str, node: str) -> str:
    """Why pod ``key`` is bound nowhere but ``node`` while its pin there is not shown by the watch."""
    return (f"an earlier bind of pod {key} wrote its assignment for node {node} (or may have: its answer "
            "was lost), which the watch has not shown yet; its cards stay booked there until it does")


@dataclass(frozen=True)
class PinnedElsewhere(Unschedulable):
    """A bind refused because an earlier bind of the pod wrote (or may have written) its assignment
    for another node, which the watch has not shown yet: those cards stay booked until it does."""


@dataclass(frozen=True)
class SeenBound(Unschedulable):
    """A bind refused because the watch shows the pod bound already (its copy of the pod was older):
    the binder reads the pod from the API and answers as for a bound pod."""


WRITTEN_STAGES = frozenset({Stage.BOUND, Stage.CONFIRMED})
"""Stages of a pod the watch shows bound with its placement: a bind never lifts that booking."""


@dataclass(frozen=True)
class Assumption:
    """What a filter's assumption was decided for, and until when it holds (on the keeper's clock)."""

    asked: PodRequest
    """The pod's request as translated from its object: the bind reuses the assumed cards only for
    the same request (a pod replaced under its name may ask for other amounts)."""
    deadline: float


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
        self.assumptions: dict[str, Assumption] = {}
        """Per pod in stage ``ASSUMED``, what its filter assumed it for and until when."""
        self.assumption_ends: Counter[str] = Counter()
        """Assumptions ended, by how (:data:`ASSUMPTION_ENDS`; metrics)."""

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
        if record is not None and record.finished:
            self.unassume(key, ASSUMED_POD_ENDED)
        seen = observe(record, pin, now=self.clock(),
                       unconfirmed_timeout_s=self.unconfirmed_timeout_s, spec_of=self.spec_of)
        if pin is not None and seen.event is not Event.SEEN_BEHIND:
            del self.pins[key]  # shown by the watch, ended with the pod, or out of time
        held = self.state.placements.get(key)
        self._fire(key, seen.event, seen.placement, seen.problem)
        adopted = record.adopted.on(record.node_name) if record is not None and record.adopted and \
            record.node_name and record.assignment is None else None
        if record is not None and adopted is not None and adopted.problem and key in self.state.placements:
            self.problems.adopted_whole(key, record.uid, f"pod {key}: {adopted.problem}")
        if held is not None and key not in self.state.placements and seen.event is Event.SEEN_NOTHING:
            self._count_release(key, held, record)
        if pin is not None and seen.event is Event.TIMED_OUT:
            self.sync(key)  # what the API says, now that the pin is gone

    def sync_node(self, name: str) -> None:
        """Re-sync every pod whose booking depends on node ``name`` (it arrived, changed or left)."""
        if self.spec_of(name) is None:
            self.problems.cards_over(self.state, name, (), self.uid_of)
            for key in sorted(self._on_node.get(name, ())):
                self.unassume(key, ASSUMED_POD_ENDED)  # the filter's choice went with the node
        for key in sorted(self._on_node.get(name, ())):
            self.sync(key)

    def _count_release(self, key: str, held: Placement, record: PodRecord | None) -> None:
        """Count and log a booking the pod's end (or its cleared assignment) just gave back."""
        reason = ENDED_DELETED if record is None else ENDED_FINISHED if record.finished else ENDED_CLEARED
        self.released[reason] += 1
        log.info("pod %s %s: released its booking on node %s (cards %s)", key, reason, held.node,
                 sorted({s.card for c in held.containers for s in c.slices}))
        self.on_release(key)

    def own_pin(self, key: str, uid: str = "") -> Pin | None:
        """The pin of pod ``key`` if it was written for the pod of ``uid`` ("": any); a pin written
        for an earlier pod of the name is not its (the Binding's uid precondition keeps it off)."""
        pin = self.pins.get(key)
        if pin is not None and uid and pin.assignment.pod_uid not in ("", uid):
            return None
        return pin

    def forget_pin(self, key: str, uid: str = "") -> None:
        """The pod of ``uid`` is gone: nothing is left for its pin to hold. A pin written for
        another pod of the name is kept: the watch, behind the API, delivers an earlier pod's
        deletion after the binder bound its replacement (read from the API), and that replacement's
        cards must stay booked until the watch shows it."""
        pin = self.pins.get(key)
        if pin is not None and (not uid or pin.assignment.pod_uid in ("", uid)):
            del self.pins[key]

    def gone(self, key: str) -> None:
        """The pod object the watch knew is gone (deleted, or replaced under its name): a filter's
        assumption for it ends (a bind in flight keeps its reservation)."""
        self.unassume(key, ASSUMED_POD_ENDED)
        self.problems.forget_pod(key)

    def expire(self) -> list[str]:
        """Re-evaluate unbound assignments and pins against the clock, and end assumptions past
        their deadline; returns pods whose booking ended."""
        ended = self.drop_lapsed()
        keys = [k for k, r in self.pods.items() if r.assignment is not None and not r.node_name]
        for key in sorted({*keys, *self.pins}):
            had = key in self.state.placements
            self.sync(key)
            if had and key not in self.state.placements:
                ended.append(key)
        return ended

    # ----------------------------------------------------------------------------- filter side
    def assume(self, asked: PodRequest, request: PodRequest, node: str, scheduler: Scheduler, *, hold_s: float,
               check: Callable[[Placement], str | None] | None = None,
               borrow: Callable[[PodRequest, str], Placement | Unschedulable] | None = None) -> Placement | None:
        """Book the filter's choice of cards for ``request`` on ``node`` (the one node it passed) as
        ``ASSUMED`` for ``hold_s`` seconds; None when nothing was booked: the pod holds something
        already (a bind in flight, a written assignment: that booking stands), or the node refuses it.

        ``asked``: the request as translated from the pod (``request`` is it narrowed by the pod's
        tenancy); ``check`` and ``borrow`` as for :meth:`reserve`. A previous assumption of the pod
        is replaced."""
        key = request.key
        self.unassume(key, ASSUMED_REPLACED)
        if self.bookings.get(key, Booking()).stage in HOLDING:
            return None
        if request.wants_gpu and node in self.problems.refused_nodes:
            return None
        decision = self._choose(request, node, scheduler, check, borrow)
        if not isinstance(decision, Placement):
            return None
        try:
            self.state.apply(decision, scope_of(request))
        except AllocationError:
            return None
        self.assumptions[key] = Assumption(asked, self.clock() + hold_s)
        self._fire(key, Event.ASSUME, decision)
        return decision

    def unassume(self, key: str, why: str) -> None:
        """End the pod's assumption, if it has one (``why``: one of :data:`ASSUMPTION_ENDS`)."""
        if self.bookings.get(key, Booking()).stage is Stage.ASSUMED:
            self._fire(key, Event.UNASSUME, why=why)

    def drop_lapsed(self) -> list[str]:
        """End the assumptions whose deadline has passed; returns their pods."""
        if not self.assumptions:
            return []
        now = self.clock()
        lapsed = sorted(key for key, held in self.assumptions.items() if held.deadline <= now)
        for key in lapsed:
            self.unassume(key, ASSUMED_EXPIRED)
        return lapsed

    # ----------------------------------------------------------------------------- binder side
    def reserve(self, request: PodRequest, node: str, scheduler: Scheduler, *,
                check: Callable[[Placement], str | None] | None = None,
                borrow: Callable[[PodRequest, str], Placement | Unschedulable] | None = None,
                asked: PodRequest | None = None, uid: str = "") -> Placement | Unschedulable:
        """Choose the cards for a bind in flight and book them (see :meth:`ClusterCache.reserve`).

        ``check``: a last word on the chosen placement (the pod's quotas), asked after the pod's
        previous booking is lifted and before the new one is booked, in this one step. ``borrow``:
        the choice on lent capacity when no owned capacity holds the pod (:mod:`gpupool.extender.borrowing`).
        ``asked``: the request as translated from the pod; when the pod's filter assumed the same
        request on this node, those cards become the reservation (if they still pass the checks).
        An assumption is never restored: a bind that books nothing ends it. ``uid``: the pod's (""
        when not known); a pin or a bound record of another pod of the name is not this pod's.

        A placement the API holds, or may hold, is never lifted to decide afresh: a pin (a write of
        an earlier bind of the pod that the watch has not shown yet: it succeeded, or its answer
        was lost) is the reservation again on its node, with those very cards, and refuses the
        bind on another node (:class:`PinnedElsewhere`); a pod the watch shows bound refuses it
        (:class:`SeenBound`). Why: a bind of the pod sent again (kube-scheduler gave up on the
        first, or got an error for a write that was applied) decided from the watch's older copy,
        lifted the written cards and chose others; until its Binding was refused (409, bound
        already), the ledger showed the written cards free and another pod's bind was given them
        (tests/extender/test_bind_interleavings.py)."""
        key = request.key
        refused = self.problems.refused_nodes.get(node)
        if refused is not None and request.wants_gpu:
            return Unschedulable(key, refused)
        pin = self.own_pin(key, uid)
        booking = self.bookings.get(key, Booking())
        ours = not uid or self.uid_of(key) in ("", uid)  # the watch's record may be an earlier pod's
        if pin is None and ours and booking.stage in WRITTEN_STAGES and booking.placement is not None:
            return SeenBound(key, f"the watch shows pod {key} bound to node {booking.placement.node}")
        if pin is not None and pin.node != node:
            return PinnedElsewhere(key, pinned_elsewhere(key, pin.node))
        assumption = self.assumptions.get(key)
        previous = self._release(key)
        decision: Placement | Unschedulable | None = None
        if pin is not None:
            decision = pin.placement  # whichever of the two writes lands, the ledger holds what it names
        elif (assumption is not None and previous is not None and previous.node == node
                and assumption.asked == asked and self.state.check(previous, scope_of(request)) is None
                and (check is None or check(previous) is None)):
            decision = previous  # the filter's choice, as kube-scheduler's bind takes its assumed pod
        if decision is None:
            decision = self._choose(request, node, scheduler, check, borrow)
        if isinstance(decision, Placement):
            try:
                self.state.apply(decision, scope_of(request))
            except AllocationError as exc:  # assign() checked it under the lock; kept as a guard
                decision = Unschedulable(key, str(exc))
            else:
                self._fire(key, Event.RESERVE, decision)
                return decision
        if assumption is not None:
            self._fire(key, Event.UNASSUME, why=ASSUMED_REFUSED)
        elif previous is not None:
            self._book(key, previous)
        return decision

    @staticmethod
    def _choose(request: PodRequest, node: str, scheduler: Scheduler,
                check: Callable[[Placement], str | None] | None,
                borrow: Callable[[PodRequest, str], Placement | Unschedulable] | None) -> Placement | Unschedulable:
        """The core's cards for ``request`` on ``node`` (lent capacity when ``borrow`` and nothing
        owned holds it), refused when ``check`` says so; nothing booked."""
        key = request.key
        decision = scheduler.assign(request, node)
        if isinstance(decision, Unschedulable) and borrow is not None:
            lent = borrow(request, node)
            decision = lent if isinstance(lent, Placement) else Unschedulable(key, f"{decision.reason}; {lent.reason}")
        if isinstance(decision, Placement) and check is not None:
            reason = check(decision)
            if reason is not None:
                decision = Unschedulable(key, reason)
        return decision

    def commit(self, key: str, assignment: Assignment, node: str = "") -> None:
        """Pin what the bind wrote (see :meth:`ClusterCache.commit`); ``node``: the node its
        Binding named ("": the assignment's)."""
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
        pinned = self.pins.get(key)
        earlier = (pinned.assignment, *pinned.earlier) if pinned is not None and pinned.placement == placement else ()
        self.pins[key] = Pin(placement, assignment, self.clock() + PIN_SECONDS, earlier, node)
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
              problem: str | None = None, why: str = "") -> None:
        old = self.bookings.get(key, Booking())
        try:
            new = advance(old, event, placement, problem)
        except BookingError as exc:
            log.error("pod %s: %s; booking kept as it is", key, exc)
            return
        if old.stage is Stage.ASSUMED and new.stage is not Stage.ASSUMED:
            self.assumptions.pop(key, None)
            self.assumption_ends[why or _assumption_end(old, event, placement)] += 1
        if new.stage in IDLE and key not in self.pods and key not in self.pins:
            self.bookings.pop(key, None)
        else:
            self.bookings[key] = new
        if new.stage is Stage.UNREADABLE and new.placement is not None:
            self.problems.set_unreadable(key, self.uid_of(key), new.placement.node, new.problem or "")
        elif key in self.problems.unreadable:  # nearly always not: no call into the problems then
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
                self.state.claim(desired)
            except AllocationError as exc:
                log.error("pod %s: cannot book %s: %s", key, desired, exc)
                return
            over = self.state.over_capacity(desired.node)
            if over:
                over = self._yield_assumptions(desired.node, over)
            if over or desired.node in self.problems.overcommitted:
                self.problems.cards_over(self.state, desired.node, over, self.uid_of)

    def _yield_assumptions(self, node: str, over: tuple[int, ...]) -> tuple[int, ...]:
        """End the assumptions holding a card of ``node`` that a claim just took beyond its
        capacity (an assumption is the filter's guess, the claim is the cluster's); the cards
        still over capacity afterwards."""
        row = self.state.index[node]
        cards = set(over)
        yielding = sorted(k for k in self.state.pods_on.get(row, ()) if self.bookings.get(k, Booking()).stage
                          is Stage.ASSUMED and cards.intersection(self.state.placements[k].held_per_card()))
        if not yielding:
            return over
        for key in yielding:
            self._fire(key, Event.UNASSUME, why=ASSUMED_CONFLICT)
        self.state.upsert_node(self.state.specs[row])  # a release from a card over capacity: derive it again
        return self.state.over_capacity(node)

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


def _assumption_end(old: Booking, event: Event, placement: Placement | None) -> str:
    """How an assumption ended when the event itself says (a bind's reservation, the watch)."""
    if event is Event.RESERVE:
        same = placement is not None and old.placement is not None and placement.node == old.placement.node
        return ASSUMED_RESERVED if same else ASSUMED_MOVED
    if event is Event.ASSUME:
        return ASSUMED_REPLACED
    return ASSUMED_SEEN
