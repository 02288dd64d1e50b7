"""Lent cards: the capacity an idle owner's card lends to borrowers, booked apart from its owners'.

A card its owners hold without using it is lent (Huanrong CN114675976B, claims 1 and 5): the node
agent says how much of it a borrower may take (:class:`Loan`). That amount is not the card's free
capacity in the ledger: the owners' bookings stay whole (they come back at any moment), and the
borrowers are counted against the loan alone. So a card has two budgets, and no card ever holds
more than both allow together:

* its owners' bookings, at most the card (the card rule, :mod:`gpupool.core.card_rule`);
* its borrowers' bookings, at most the loan (:func:`lent_verdict`), slices only: a borrower never
  takes a card whole (its owners still hold it).

A card's lending state (:class:`LentState`) is ``NOT_LENT``, ``LENT`` (a loan), or ``WITHDRAWN``
(no loan any more, borrowers still booked: they keep their bookings until they leave, the node
agent reclaims them, and no new borrower is placed). A loan that shrinks below what its borrowers
hold likewise takes no new borrower until enough have left.

Pure bookkeeping: :class:`gpupool.core.state.ClusterState` books a placement with a
``borrowed_from`` owner here instead of on the card's own amounts; :mod:`gpupool.core.lent_view`
answers "where and on which cards could this pod borrow" with the core's own filter and card choice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum

from gpupool.core.card_rule import BoolArray, CardSlots, CardVerdict, Demand, slot_checks

HeldPerCard = Mapping[int, tuple[int, int, bool]]
"""Per card position: memory MiB, compute per-mille, whole card (:meth:`Placement.held_per_card`)."""


@dataclass(frozen=True)
class Loan:
    """What a borrower may take of one card (``card``: its position in the node's cards, the
    ledger's column) and whose card it is (``owner``: ``namespace/name``)."""

    card: int
    owner: str
    memory_mib: int
    compute: int
    """Per-mille of the card."""


class LentState(StrEnum):
    """Whether a card is lent now (see the module docstring)."""

    NOT_LENT = "not-lent"
    LENT = "lent"
    WITHDRAWN = "withdrawn"


class LentVerdict(IntEnum):
    """Why a card cannot take a borrower's slice (``FITS`` when it can), in the order checked.
    ``CARD``: the card itself refuses (missing, unhealthy, outside the pod's scope: the card rule's
    own verdict says which)."""

    FITS = 0
    CARD = 1
    WHOLE_CARD = 2
    NOT_LENT = 3
    NO_LENT_MEMORY = 4
    NO_LENT_COMPUTE = 5


def lent_verdict(slots: CardSlots, loan: Loan | None, borrowed: tuple[int, int], demand: Demand) -> LentVerdict:
    """The lent-card rule for one card (scalars): the card rule's slot checks, then slices only, a
    loan, and the loan's memory and compute less what its borrowers hold (``borrowed``)."""
    if any(not passes for _, passes in slot_checks(slots)):
        return LentVerdict.CARD
    if demand.exclusive:
        return LentVerdict.WHOLE_CARD
    if loan is None:
        return LentVerdict.NOT_LENT
    if loan.memory_mib - borrowed[0] < int(demand.memory):
        return LentVerdict.NO_LENT_MEMORY
    if loan.compute - borrowed[1] < int(demand.compute):
        return LentVerdict.NO_LENT_COMPUTE
    return LentVerdict.FITS


def card_refusal(slots: CardSlots) -> CardVerdict:
    """The card rule's verdict of a card that refuses as such (see :attr:`LentVerdict.CARD`)."""
    return next((code for code, passes in slot_checks(slots) if not passes), CardVerdict.FITS)


@dataclass(frozen=True)
class LentTotals:
    """What the ledger's loans add up to (the extender's metrics export these)."""

    lending_nodes: int = 0
    lent_cards: int = 0
    """Cards with a loan now."""
    withdrawn_cards: int = 0
    """Cards without a loan whose borrowers are still booked (the node agent is reclaiming them)."""
    borrowers: int = 0
    """Pods booked on lent capacity."""
    lent_memory_mib: int = 0
    borrowed_memory_mib: int = 0


class LentBook:
    """The loans of every node row and what borrowers hold on them.

    Rows and card positions are the ledger's. Holding a pod is idempotent (the ledger re-books a
    node's placements when its description changes), and a node's loans are replaced whole, as the
    node agent publishes them.
    """

    def __init__(self) -> None:
        self._loans: dict[int, dict[int, Loan]] = {}
        self._held: dict[str, tuple[int, dict[int, tuple[int, int]]]] = {}
        self._borrowed: dict[tuple[int, int], list[int]] = {}
        """(row, card) → [memory, compute, borrowers]."""

    # -------------------------------------------------------------------------------- loans
    def set_loans(self, row: int, loans: Iterable[Loan]) -> bool:
        """Replace the loans of ``row``; True when they changed. Borrowers keep their bookings."""
        new = {loan.card: loan for loan in loans}
        if self._loans.get(row, {}) == new:
            return False
        if new:
            self._loans[row] = new
        else:
            self._loans.pop(row, None)
        return True

    def loans(self, row: int) -> dict[int, Loan]:
        """The loans of ``row`` by card position (a copy)."""
        return dict(self._loans.get(row, {}))

    def loan(self, row: int, card: int) -> Loan | None:
        return self._loans.get(row, {}).get(card)

    def lending_rows(self) -> list[int]:
        """Rows with at least one loan, in order."""
        return sorted(self._loans)

    def totals(self) -> LentTotals:
        """Every loan and borrower summed (a scrape's read; its cost grows with the loans only)."""
        lent = {(row, card) for row, loans in self._loans.items() for card in loans}
        withdrawn = sum(1 for key in self._borrowed if key not in lent)
        return LentTotals(
            lending_nodes=len(self._loans), lent_cards=len(lent), withdrawn_cards=withdrawn,
            borrowers=len(self._held),
            lent_memory_mib=sum(loan.memory_mib for loans in self._loans.values() for loan in loans.values()),
            borrowed_memory_mib=sum(acc[0] for acc in self._borrowed.values()))

    # ------------------------------------------------------------------------------ borrowers
    def hold(self, key: str, row: int, held: HeldPerCard) -> None:
        """Book (or book again) what borrower ``key`` holds on the cards of ``row``."""
        self.drop(key)
        mine = {card: (mib, milli) for card, (mib, milli, _) in held.items()}
        self._held[key] = (row, mine)
        for card, (mib, milli) in mine.items():
            acc = self._borrowed.setdefault((row, card), [0, 0, 0])
            acc[0] += mib
            acc[1] += milli
            acc[2] += 1

    def drop(self, key: str) -> None:
        """Give back what borrower ``key`` holds (unknown keys are ignored)."""
        found = self._held.pop(key, None)
        if found is None:
            return
        row, mine = found
        for card, (mib, milli) in mine.items():
            acc = self._borrowed[(row, card)]
            acc[0] -= mib
            acc[1] -= milli
            acc[2] -= 1
            if acc[2] == 0:
                del self._borrowed[(row, card)]

    def forget_row(self, row: int) -> None:
        """The node left: its loans and its borrowers' bookings go."""
        self._loans.pop(row, None)
        for key in [k for k, (r, _) in self._held.items() if r == row]:
            self.drop(key)

    def borrowed(self, row: int, card: int) -> tuple[int, int]:
        """Memory and compute the borrowers of a card hold."""
        acc = self._borrowed.get((row, card))
        return (acc[0], acc[1]) if acc is not None else (0, 0)

    def borrowers(self, row: int, card: int) -> int:
        acc = self._borrowed.get((row, card))
        return acc[2] if acc is not None else 0

    def free(self, row: int, card: int) -> tuple[int, int]:
        """Memory and compute a new borrower may still take (negative once a loan shrank or went)."""
        loan = self.loan(row, card)
        mib, milli = self.borrowed(row, card)
        if loan is None:
            return -max(mib, 1), -max(milli, 1)
        return loan.memory_mib - mib, loan.compute - milli

    def state(self, row: int, card: int) -> LentState:
        if self.loan(row, card) is not None:
            return LentState.LENT
        return LentState.WITHDRAWN if self.borrowers(row, card) else LentState.NOT_LENT

    def verdict(self, row: int, card: int, slots: CardSlots, demand: Demand) -> LentVerdict:
        """:func:`lent_verdict` for one card of ``row``."""
        return lent_verdict(slots, self.loan(row, card), self.borrowed(row, card), demand)

    def book(self, row: int, key: str, held: HeldPerCard, sign: int) -> None:
        """Take (``sign`` 1) or give back (-1) what borrower ``key`` holds on ``row``."""
        if sign > 0:
            self.hold(key, row, held)
        else:
            self.drop(key)

    def refusal(self, node: str, row: int, held: HeldPerCard, exists: BoolArray, healthy: BoolArray,
                in_scope: BoolArray | None) -> str | None:
        """Why a borrower's slices (``held``) cannot be booked on the cards of ``row``, or None;
        ``exists``/``healthy``/``in_scope``: the ledger's rows of those flags."""
        for card, (memory, compute, exclusive) in held.items():
            if not 0 <= card < len(exists):
                return f"node {node} has no card {card}"
            slots = CardSlots(exists[card], healthy[card], in_scope=None if in_scope is None else in_scope[card])
            demand = Demand(memory, compute, exclusive)
            verdict = self.verdict(row, card, slots, demand)
            if verdict != LentVerdict.FITS:
                return lent_refusal(node, card, verdict, slots, demand, self.free(row, card))
        return None

    def over_loan(self, row: int) -> tuple[int, ...]:
        """Card positions of ``row`` whose borrowers hold more than the loan (or hold without one)."""
        over: list[int] = []
        for (r, card), (mib, milli, _) in self._borrowed.items():
            loan = self.loan(r, card) if r == row else None
            if r == row and (loan is None or mib > loan.memory_mib or milli > loan.compute):
                over.append(card)
        return tuple(sorted(over))

def lent_refusal(node: str, card: int, verdict: LentVerdict, slots: CardSlots, demand: Demand,
                 free: tuple[int, int]) -> str:
    """The ledger's sentence for a card that refuses a borrower's slice."""
    if verdict == LentVerdict.CARD:
        return f"node {node} card {card}: {card_refusal(slots).name.lower().replace('_', ' ')}"
    if verdict == LentVerdict.WHOLE_CARD:
        return f"node {node} card {card}: a borrower takes slices of a lent card, never the whole card"
    if verdict == LentVerdict.NOT_LENT:
        return f"node {node} card {card} is not lent"
    if verdict == LentVerdict.NO_LENT_MEMORY:
        return (f"node {node} card {card}: {int(demand.memory)} MiB requested, "
                f"{max(free[0], 0)} MiB of its loan free")
    return (f"node {node} card {card}: compute {int(demand.compute)}/1000 requested, "
            f"{max(free[1], 0)}/1000 of its loan free")
