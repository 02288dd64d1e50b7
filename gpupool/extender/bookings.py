"""The life cycle of one pod's booking, as a table of transitions.

This module owns the states a booking can be in and the events that move it (the shape of h11's
``_state.py``): the cache (:mod:`gpupool.extender.cache`) feeds it events from the binder (reserve,
commit, rollback), from the watch (what the latest pod object says, classified by :func:`observe`)
and from the clock, and books in the ledger whatever the resulting stage holds. A pair of stage and
event that is not in :data:`TRANSITIONS` raises :class:`BookingError`: the table is the whole rule.

The usual path, and the ways out::

    NONE --ASSUME--> ASSUMED --RESERVE--> RESERVED --COMMIT--> PINNED --SEEN_BOUND--> BOUND
                        |                    |                   |   (the watch shows   |
                    UNASSUME              ROLLBACK           TIMED_OUT   the write)   SEEN_NOTHING
                        v                    v                   v                      v
                      NONE              ROLLED_BACK           EXPIRED               RELEASED

    BOUND --SEEN_CONFIRMED--> CONFIRMED (the node agent's allocated-v1); a bind may also start
    from NONE (no filter passed the pod one node, or its assumption ended).

A filter that passes a pod one node books its choice there (``ASSUMED``, as kube-scheduler's own
cache assumes a pod before its bind), so the filters of other pods that come before the bind see
it. The watch's word on a pending pod (it holds nothing) does not lift it; a bind turns it into its
reservation (``RESERVE``, on the assumed node or another), and ``UNASSUME`` ends it without one:
the bind was refused, a later filter of the pod decided again, the pod was deleted or finished, a
claim of the cluster needed its cards, or its deadline passed (:mod:`gpupool.extender.booking_keeper`
fires it). A bind in flight (``RESERVED``) holds its cards whatever the watch says meanwhile. A bind
that wrote its assignment (``PINNED``) holds them until the watch shows that write (an older event still
in the stream must not free them), the pod ends, or ``PIN_SECONDS`` pass. Pods the watch shows are
``ANNOTATED`` (not bound yet: expires after the unconfirmed timeout), ``BOUND`` or ``CONFIRMED``
(by the node agent's ``allocated-v1``). A pod bound by kube-scheduler alone, without GPUs, is
``BOUND`` with its CPU and memory only. A bound pod whose assignment cannot be read is
``UNREADABLE``: it holds its CPU and memory, and the cache refuses GPU placements on its node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from gpupool.api.annotations import Assignment
from gpupool.core.model import NodeSpec, Placement
from gpupool.kube.pod_holding import Holding, HoldingKind, PodRecord, holding

PIN_SECONDS = 120.0
"""How long a committed bind is held against a watch that has not yet shown its assignment."""


class Stage(StrEnum):
    """Where a pod's booking is; the stages in :data:`HOLDING` hold a placement in the ledger."""

    NONE = "none"
    WAITING = "waiting"
    """The pod names a node the ledger does not have (yet): booked when the node arrives."""
    ASSUMED = "assumed"
    """The filter passed the pod one node: its choice there is held until the bind, a later filter
    of the pod, the pod's end or a deadline (in memory only: nothing is written for it)."""
    RESERVED = "reserved"
    PINNED = "pinned"
    ANNOTATED = "annotated"
    BOUND = "bound"
    CONFIRMED = "confirmed"
    UNREADABLE = "unreadable"
    EXPIRED = "expired"
    RELEASED = "released"
    ROLLED_BACK = "rolled_back"


class Event(StrEnum):
    """What can happen to a booking: binder calls, watch observations, the clock."""

    ASSUME = "assume"
    """The filter passed the pod one node (a later filter of it replaces its choice)."""
    UNASSUME = "unassume"
    """An assumption ends without a reservation: see :class:`Stage` ``ASSUMED``."""
    RESERVE = "reserve"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    SEEN_NOTHING = "seen_nothing"
    """The pod holds nothing: deleted, finished, or neither annotated nor bound."""
    SEEN_ANNOTATED = "seen_annotated"
    SEEN_BOUND = "seen_bound"
    SEEN_CONFIRMED = "seen_confirmed"
    SEEN_UNREADABLE = "seen_unreadable"
    SEEN_UNKNOWN_NODE = "seen_unknown_node"
    SEEN_BEHIND = "seen_behind"
    """The watch has not yet shown the assignment this extender committed for the pod."""
    TIMED_OUT = "timed_out"
    """An unbound, unconfirmed assignment outlived the unconfirmed timeout, or a pin its deadline."""


class BookingError(RuntimeError):
    """An event that the table does not allow in the booking's stage."""


HOLDING = frozenset({Stage.ASSUMED, Stage.RESERVED, Stage.PINNED, Stage.ANNOTATED, Stage.BOUND, Stage.CONFIRMED,
                     Stage.UNREADABLE})
IDLE = frozenset(set(Stage) - HOLDING)
"""Stages that hold nothing; every event leads out of them the same way."""

_SEEN = {Event.SEEN_ANNOTATED: Stage.ANNOTATED, Event.SEEN_BOUND: Stage.BOUND,
         Event.SEEN_CONFIRMED: Stage.CONFIRMED, Event.SEEN_UNREADABLE: Stage.UNREADABLE,
         Event.SEEN_UNKNOWN_NODE: Stage.WAITING}
"""Where a watch observation leads from any stage the watch decides (the API is the truth there)."""

_FROM_IDLE: dict[Event, Stage] = {
    Event.ASSUME: Stage.ASSUMED,
    Event.RESERVE: Stage.RESERVED,
    Event.COMMIT: Stage.PINNED,  # a write whose reservation a concurrent bind of the pod ended: still held
    Event.SEEN_NOTHING: Stage.NONE,
    Event.SEEN_BEHIND: Stage.PINNED,  # a pin kept across a retried bind that rolled back
    Event.TIMED_OUT: Stage.EXPIRED,
    **_SEEN,
}
_FROM_PINNED: dict[Event, Stage] = {
    Event.RESERVE: Stage.RESERVED,
    Event.COMMIT: Stage.PINNED,
    Event.SEEN_NOTHING: Stage.RELEASED,
    Event.SEEN_BEHIND: Stage.PINNED,
    Event.TIMED_OUT: Stage.EXPIRED,
    **_SEEN,
}
_FROM_SEEN: dict[Event, Stage] = {
    Event.RESERVE: Stage.RESERVED,  # a retried bind lifts the pod's own earlier assignment
    Event.COMMIT: Stage.PINNED,
    Event.SEEN_NOTHING: Stage.RELEASED,
    **_SEEN,
}

_FROM_ASSUMED: dict[Event, Stage] = {
    Event.ASSUME: Stage.ASSUMED,  # a later filter of the pod decided again
    Event.UNASSUME: Stage.NONE,
    Event.RESERVE: Stage.RESERVED,  # the bind: on the assumed node or another
    Event.COMMIT: Stage.PINNED,
    Event.SEEN_NOTHING: Stage.ASSUMED,  # pending, as an assumed pod is (or not delivered by the watch yet)
    Event.TIMED_OUT: Stage.ASSUMED,  # an expired assignment of an earlier attempt: the assumption is newer
    Event.SEEN_BEHIND: Stage.PINNED,
    **_SEEN,  # bound or annotated by a writer: the API is the truth
}

TRANSITIONS: dict[tuple[Stage, Event], Stage] = {
    **{(stage, event): to for stage in IDLE for event, to in _FROM_IDLE.items()},
    **{(Stage.ASSUMED, event): to for event, to in _FROM_ASSUMED.items()},
    (Stage.RESERVED, Event.RESERVE): Stage.RESERVED,  # a retried bind replaces its reservation
    (Stage.RESERVED, Event.COMMIT): Stage.PINNED,
    (Stage.RESERVED, Event.ROLLBACK): Stage.ROLLED_BACK,
    **{(Stage.RESERVED, event): Stage.RESERVED
       for event in (Event.SEEN_NOTHING, Event.SEEN_BEHIND, Event.TIMED_OUT, *_SEEN)},
    **{(Stage.PINNED, event): to for event, to in _FROM_PINNED.items()},
    **{(stage, event): to for stage in (Stage.ANNOTATED, Stage.BOUND, Stage.CONFIRMED, Stage.UNREADABLE)
       for event, to in _FROM_SEEN.items()},
    (Stage.ANNOTATED, Event.TIMED_OUT): Stage.EXPIRED,
}
"""(stage, event) → next stage. Not here, by design: a rollback without a reservation, a time-out
of a bound pod, an observation "behind a pin" in a stage the watch already decided, an assumption
of a pod that holds something (a bind in flight, a written assignment: that booking stands), the end
of an assumption that is not there."""

HELD = frozenset({*((Stage.RESERVED, event) for event in Event if event not in
                    (Event.RESERVE, Event.COMMIT, Event.ROLLBACK)),
                  (Stage.ASSUMED, Event.SEEN_NOTHING), (Stage.ASSUMED, Event.TIMED_OUT)})
"""Transitions that keep the booking as it is: a bind in flight holds its cards, and so does an
assumption while the watch shows its pod pending."""


@dataclass(frozen=True)
class Booking:
    """A pod's stage and what it holds in the ledger (None in the stages that hold nothing)."""

    stage: Stage = Stage.NONE
    placement: Placement | None = None
    problem: str | None = None


def next_stage(stage: Stage, event: Event) -> Stage:
    """The stage after ``event``; raises :class:`BookingError` when the table does not allow it."""
    try:
        return TRANSITIONS[(stage, event)]
    except KeyError:
        raise BookingError(f"booking in stage {stage.value} cannot take event {event.value}") from None


def advance(booking: Booking, event: Event, placement: Placement | None = None,
            problem: str | None = None) -> Booking:
    """The booking after ``event``, holding ``placement`` if the new stage holds anything."""
    stage = next_stage(booking.stage, event)
    if (booking.stage, event) in HELD:
        return booking
    if stage not in HOLDING:
        return Booking(stage, problem=problem)
    return Booking(stage, placement, problem)


@dataclass(frozen=True)
class Pin:
    """A bind this extender committed: its placement, the assignment it wrote, and until when it is
    held against a watch that has not shown that assignment."""

    placement: Placement
    assignment: Assignment
    deadline: float
    earlier: tuple[Assignment, ...] = ()
    """Assignments of earlier binds of the pod that named the same cards and may have been written
    too (a bind sent again writes its pin's cards: :meth:`BookingKeeper.reserve`); either one shown
    shows those cards held."""
    bound_to: str = ""
    """The node the Binding named ("": the placement's; a remote share's placement is its server's)."""

    @property
    def node(self) -> str:
        """The node the pod is (or may be) bound to by this write."""
        return self.bound_to or self.placement.node

    def shown_by(self, record: PodRecord | None) -> bool:
        """Whether the pod object carries this very assignment, or an earlier one of the same cards
        (same node, same time stamp)."""
        seen = record.assignment if record is not None else None
        return seen is not None and any((seen.node, seen.time) == (written.node, written.time)
                                        for written in (self.assignment, *self.earlier))


@dataclass(frozen=True)
class Observation:
    """What the latest pod object says about the booking: an event, the placement it holds, and why
    an assignment could not be used."""

    event: Event
    placement: Placement | None = None
    problem: str | None = None


_SEEN_HOLDING = {HoldingKind.NOTHING: Event.SEEN_NOTHING, HoldingKind.EXPIRED: Event.TIMED_OUT,
                 HoldingKind.UNKNOWN_NODE: Event.SEEN_UNKNOWN_NODE, HoldingKind.HOST_ONLY: Event.SEEN_BOUND,
                 HoldingKind.UNREADABLE: Event.SEEN_UNREADABLE}
"""The event each kind of holding means; a placement's depends on how far it got (:func:`_placed`)."""

_WITH_PROBLEM = frozenset({HoldingKind.NOTHING, HoldingKind.UNREADABLE})
"""The kinds whose observation carries why the pod's assignment or request could not be used."""


def observe(record: PodRecord | None, pin: Pin | None, *, now: float, unconfirmed_timeout_s: float,
            spec_of: Callable[[str], NodeSpec | None]) -> Observation:
    """Classify the latest pod object (None: deleted, or not delivered by the watch yet) into the
    event it means for the booking.

    What the object holds is the shared rule (:func:`gpupool.kube.pod_holding.holding`); the
    extender's own part is its pin: a committed bind the watch has not shown yet holds its cards
    until it is shown, the pod ends, or the pin's deadline passes.
    ``spec_of`` gives a present node's spec (None for a node the ledger does not have).

    No object with a pin is a pod the watch has not delivered yet, not a deleted one (the cache
    forgets a pod's pin before it forgets a deleted pod): its bind read the pod from the API and
    committed first. Why held: read as deleted, the cards of a pod bound a moment ago were free
    until the watch delivered the pod, and the next bind was given them (kube-scheduler's informer
    saw six pods created at once before the extender's watch did:
    tests/extender/test_bind_interleavings.py).
    """
    if record is None and pin is not None:
        if now > pin.deadline:
            return Observation(Event.TIMED_OUT)
        return Observation(Event.SEEN_BEHIND, pin.placement)
    if record is None or record.finished:
        return Observation(Event.SEEN_NOTHING)
    if pin is not None and not pin.shown_by(record):
        if now > pin.deadline:
            return Observation(Event.TIMED_OUT)
        return Observation(Event.SEEN_BEHIND, pin.placement)
    held = holding(record, spec_of, now=now, unconfirmed_timeout_s=unconfirmed_timeout_s)
    event = _placed(held) if held.kind is HoldingKind.PLACEMENT else _SEEN_HOLDING[held.kind]
    if held.kind not in _WITH_PROBLEM:
        return Observation(event, held.placement)
    problem = f"pod {record.key}: {held.problem}" if held.problem is not None else record.request_problem
    return Observation(event, held.placement, problem)


def _placed(held: Holding) -> Event:
    """The event of a pod holding its assignment's placement: confirmed, bound or only annotated."""
    if held.confirmed:
        return Event.SEEN_CONFIRMED
    return Event.SEEN_BOUND if held.bound else Event.SEEN_ANNOTATED


OVERCOMMITTED = "GpupoolCardOverCommitted"
"""Event reason on the pods that together claim more of a card than it has."""
UNREADABLE = "GpupoolAssignmentUnreadable"
"""Event reason on a bound pod whose assignment the extender cannot read."""


@dataclass(frozen=True)
class Notice:
    """A booking problem to report on a pod as a Kubernetes Event (posted outside the cache lock,
    by :mod:`gpupool.extender.housekeeping`)."""

    pod_key: str
    uid: str
    reason: str
    message: str
