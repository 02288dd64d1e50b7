"""Which borrowers a loan shrunk below their bookings reclaims: only as many as it takes to fit.

A loan shrinks when an owner not among its owners is booked on its card
(:func:`~gpupool.nodeagent.lending.loans.keep_new_bookings`). Its borrowers were placed against the
larger loan; when together they are booked more than the shrunk loan offers, some must go so that
the owner's share is free (seed 000, case A: the owner's need comes first). Every borrower reclaimed
loses the work it did since its last checkpoint and waits in the queue again (issue 27 counts it), so
only enough of them are reclaimed to bring the rest within the shrunk loan; the others keep running.

Who goes first (:func:`victim_order`):

1. the lowest pod priority (``spec.priority``, from its PriorityClass; every borrower is low at
   open, so this is the only rank among them): the patent's rules rank work by its priority, so a
   higher-priority borrower's work is the last to be thrown away;
2. then the one that loses least: a borrower booked on the card that has not opened it yet (nothing
   done there), then the one holding the card since the latest time (the youngest: the least work
   since it started there, and the least likely to be near a checkpoint worth keeping);
3. then the largest booking: one reclaim frees more, so fewer are reclaimed;
4. then the pod's namespace and name, so the choice is the same on every agent and after a restart.

The victims are taken in that order until the rest fit; then, from the last one taken back to the
first, a victim whose booking fits beside the others is spared (a small borrower taken before a large
one that alone would have freed enough keeps running).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from gpupool.nodeagent.lending.pods import LendingPod
from gpupool.nodeagent.lending.rules import PodKey
from gpupool.nodeagent.monitor.usage_state import Holder


@dataclass(frozen=True)
class BorrowerOnCard:
    """One borrower booked on a card, as the choice of victims sees it."""

    pod: PodKey
    priority: int
    """The pod's ``spec.priority``."""
    memory_mib: int
    compute: int
    """Per mille of the card."""
    holding_since: float | None
    """When its earliest process still holding the card was recorded opening it; ``None``: not holding it."""


def borrowers_booked(card: int, pods: Iterable[LendingPod], holders: Iterable[Holder],
                     leaving: Collection[PodKey] = ()) -> list[BorrowerOnCard]:
    """The borrowers booked on ``card`` (their assignment's share of it), except ``leaving`` (being
    reclaimed already: their share is on its way back), with when each began holding it."""
    since: dict[PodKey, float] = {}
    for holder in holders:
        key = (holder.namespace, holder.pod)
        since[key] = min(holder.since, since.get(key, holder.since))
    found = []
    for pod in pods:
        if not pod.borrowed or pod.key in leaving:
            continue
        mine = [piece for slices in pod.shares.values() for piece in slices if piece.card == card]
        if mine:
            found.append(BorrowerOnCard(pod.key, pod.spec_priority, sum(p.memory_mib for p in mine),
                                        sum(p.compute for p in mine), since.get(pod.key)))
    return found


def victim_order(borrower: BorrowerOnCard) -> tuple[int, float, int, int, PodKey]:
    """Sort key: the first victim sorts first (the module says why)."""
    started = borrower.holding_since
    return (borrower.priority,
            -float("inf") if started is None else -started,
            -borrower.memory_mib, -borrower.compute, borrower.pod)


def reclaim_to_fit(borrowers: Sequence[BorrowerOnCard], memory_mib: int, compute: int) -> tuple[PodKey, ...]:
    """The borrowers to reclaim so the others' bookings fit ``memory_mib`` and ``compute`` per mille
    (the shrunk loan), in :func:`victim_order`; none when they fit already."""
    memory = sum(b.memory_mib for b in borrowers)
    milli = sum(b.compute for b in borrowers)
    taken: list[BorrowerOnCard] = []
    for borrower in sorted(borrowers, key=victim_order):
        if memory <= memory_mib and milli <= compute:
            break
        taken.append(borrower)
        memory, milli = memory - borrower.memory_mib, milli - borrower.compute
    for borrower in reversed(list(taken)):
        if memory + borrower.memory_mib <= memory_mib and milli + borrower.compute <= compute:
            taken.remove(borrower)
            memory, milli = memory + borrower.memory_mib, milli + borrower.compute
    return tuple(b.pod for b in sorted(taken, key=victim_order))
