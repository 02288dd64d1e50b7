"""The four priority rules at open time (Huanrong CN114675976B, claims 1 and 7), as pure functions.

When a container opens a card, each container already holding it is compared with the asker:

| held at | asked at | rule | answer | reclaimed asynchronously |
|---|---|---|---|---|
| low | high | 1 | allow | the holder (its processes end first) |
| high | high | 2 | allow, record high | — |
| high | low | 3 | refuse | the asker |
| low | low | 4 | allow, record low | — |

Who is compared with whom follows gpupool's ledger, which already vouches for some sharing: two
containers *booked* on the card (each has a share of it in its assignment) never conflict, and
neither do two borrowers (the extender placed both on lent capacity). A borrower is low by
definition; a booked container facing a borrower is high (the booking outranks the loan: an owner
returning to its lent card is rule 1). Containers without a gpupool share of the card (a pod that
got the device another way) are compared by their pod priority. The owners of a lent card hold it
"dormant" while their borrowers open it: they lent it, so their hold does not refuse a borrower;
their own next open ends the loan. An owner booked on a lent card whose share the loan leaves out
(:mod:`~gpupool.nodeagent.lending.bookings`: it was placed there, or had not started, when the loan
began or grew smaller for it) never conflicts with that loan's borrowers either way: the loan it
shrank is what they hold, and those past it are reclaimed by the loan's size, not at this open
(:mod:`~gpupool.nodeagent.lending.over_loan`). A container whose pod is being reclaimed, or was
reclaimed and is still on the node (the service passes both as ``reclaiming``), is refused every
open and is never reclaimed a second time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum, StrEnum

from gpupool.api.lending import Priority
from gpupool.nodeagent.monitor.events import Verdict

ContainerKey = tuple[str, str, str]
"""(namespace, pod, container)."""
PodKey = tuple[str, str]


class Claim(StrEnum):
    """On what ground a container opens a card."""

    BOOKED = "booked"
    """Its assignment has a share of this card (not borrowed)."""
    BORROWED = "borrowed"
    """It was bound onto lent capacity of this card."""
    UNBOOKED = "unbooked"
    """A known pod without a gpupool share of this card."""


class Rule(IntEnum):
    """The patent's rule numbers; 0: nobody conflicting holds the card."""

    NO_CONFLICT = 0
    RECLAIM_LOW_HOLDER = 1
    HIGH_WITH_HIGH = 2
    REFUSE_LOW_ASKER = 3
    LOW_WITH_LOW = 4
    RECLAIM_IN_FLIGHT = 5
    """Not the patent's: the asker's pod is already being reclaimed, so it is refused."""


@dataclass(frozen=True)
class Occupant:
    """A container holding or asking for a card, with its pod's priority and its claim to the card."""

    container: ContainerKey
    priority: Priority
    claim: Claim

    @property
    def pod(self) -> PodKey:
        return (self.container[0], self.container[1])


@dataclass(frozen=True)
class RuleOutcome:
    """One row of the table: the answer and who is reclaimed."""

    rule: Rule
    verdict: Verdict
    reclaim_holder: bool
    reclaim_asker: bool


RULES: dict[tuple[Priority, Priority], RuleOutcome] = {
    (Priority.LOW, Priority.HIGH): RuleOutcome(Rule.RECLAIM_LOW_HOLDER, Verdict.ALLOW, True, False),
    (Priority.HIGH, Priority.HIGH): RuleOutcome(Rule.HIGH_WITH_HIGH, Verdict.ALLOW, False, False),
    (Priority.HIGH, Priority.LOW): RuleOutcome(Rule.REFUSE_LOW_ASKER, Verdict.DENY, False, True),
    (Priority.LOW, Priority.LOW): RuleOutcome(Rule.LOW_WITH_LOW, Verdict.ALLOW, False, False),
}
"""(held at, asked at) → outcome: the four rules."""

_STRENGTH = (Rule.NO_CONFLICT, Rule.LOW_WITH_LOW, Rule.HIGH_WITH_HIGH, Rule.RECLAIM_LOW_HOLDER,
             Rule.REFUSE_LOW_ASKER, Rule.RECLAIM_IN_FLIGHT)


@dataclass(frozen=True)
class OpenDecision:
    """The answer to one open, the rule that gave it, and the pods to reclaim asynchronously."""

    verdict: Verdict
    rule: Rule
    recorded: Priority
    """The priority the asker holds the card at when allowed (what rules 2 and 4 record)."""
    reclaim: tuple[PodKey, ...] = ()
    reason: str = ""


def conflicts(asker: Occupant, holder: Occupant, dormant: frozenset[ContainerKey],
              left_out: frozenset[ContainerKey] = frozenset()) -> bool:
    """Whether the rules compare these two at all (the ledger vouches for the other pairs)."""
    if asker.container == holder.container:
        return False
    if asker.claim is holder.claim and asker.claim in (Claim.BOOKED, Claim.BORROWED):
        return False
    borrower, other = (asker, holder) if asker.claim is Claim.BORROWED else (holder, asker)
    if borrower.claim is Claim.BORROWED and other.container in left_out:
        return False
    return not (asker.claim is Claim.BORROWED and holder.container in dormant)


def effective(occupant: Occupant, other: Occupant) -> Priority:
    """``occupant``'s priority facing ``other``: borrowers low, a booking high against a borrower."""
    if occupant.claim is Claim.BORROWED:
        return Priority.LOW
    if occupant.claim is Claim.BOOKED and other.claim is Claim.BORROWED:
        return Priority.HIGH
    return occupant.priority


def decide_open(asker: Occupant, holders: Iterable[Occupant], *, dormant: frozenset[ContainerKey] = frozenset(),
                reclaiming: frozenset[PodKey] = frozenset(),
                left_out: frozenset[ContainerKey] = frozenset()) -> OpenDecision:
    """Apply the rules between ``asker`` and every conflicting holder of the card.

    ``dormant``: the owners of the card's loan that have not opened it since it was lent;
    ``left_out``: the containers booked on the card whose share the loan leaves out (neither they nor
    the loan's borrowers are judged against the other);
    ``reclaiming``: pods whose reclaim is in flight, or finished while the pod is still listed
    (refused, never reclaimed twice, and their holds no longer count). Any refusal wins (the asker
    is reclaimed, nobody else is); otherwise the open is allowed and every low holder a high asker
    met is reclaimed.
    """
    recorded = Priority.LOW if asker.claim is Claim.BORROWED else asker.priority
    if asker.pod in reclaiming:
        return OpenDecision(Verdict.DENY, Rule.RECLAIM_IN_FLIGHT, recorded,
                            reason=f"{_name(asker)}: its pod is being reclaimed")
    strongest = Rule.NO_CONFLICT
    reclaim: list[PodKey] = []
    reasons: list[str] = []
    refusals: list[str] = []
    for holder in holders:
        if holder.pod in reclaiming or not conflicts(asker, holder, dormant, left_out):
            continue
        held, asked = effective(holder, asker), effective(asker, holder)
        outcome = RULES[(held, asked)]
        if _STRENGTH.index(outcome.rule) > _STRENGTH.index(strongest):
            strongest = outcome.rule
        if outcome.reclaim_holder and holder.pod not in reclaim:
            reclaim.append(holder.pod)
            reasons.append(f"{_name(holder)} holds it at {held} ({holder.claim}) and {_name(asker)} asks at {asked}")
        if outcome.verdict is Verdict.DENY:
            refusals.append(f"{_name(holder)} holds it at {held} and {_name(asker)} asks at {asked} ({asker.claim})")
    if refusals:
        return OpenDecision(Verdict.DENY, strongest, recorded, (asker.pod,), "; ".join(refusals))
    return OpenDecision(Verdict.ALLOW, strongest, recorded, tuple(reclaim), "; ".join(reasons))


def _name(occupant: Occupant) -> str:
    return "/".join(occupant.container)
