"""Verifying a schedule on the node before granting it, by the core's own card rule.

The extender decided from its ledger; the node knows better what it has *now*. A card can have
failed (an XID) or vanished since the pod was bound, and an extender with a stale or partitioned view
(two leaders for a moment, a restored backup) can book a card twice. kubelet's device counts do not
catch the latter: they are per resource, not per card. So before Allocate hands a container its
cards, the agent checks the container's assignment against its inventory and against the pods it has
already granted on this node (served by this agent, or recorded in their ``allocated-v1`` after a
restart). A refusal fails Allocate: kubelet fails the pod with ``UnexpectedAdmissionError`` and its
controller creates a new one, which the extender places afresh.

One rule, not two: the node builds the core's ledger for itself (:class:`NodeLedger`, a
:class:`~gpupool.core.state.ClusterState` of one node), claims what the granted pods hold there as the
extender books it (:meth:`ClusterState.claim` of :meth:`Placement.held_per_card`: app containers add
up, an init container holds its cards alone; borrowers on their loans, :mod:`gpupool.core.lent`), and
asks the core's card rule (:meth:`ClusterState.card_verdict`) or lent rule (:meth:`LentBook.verdict`)
whether the new pod's share of each card fits. Only the sentences are the node's own: they name the
card by its NVML index and uuid, the amounts, and the pods that hold it.

Two ways to the same answer, cheaper. Where no other grant holds a slice of the container's cards,
the ledger would have them idle and whole: the card rule is asked about them as such, without
building it (:func:`refuse_on_idle_cards`). Else the agent's ledger is kept between Allocates and
only the pods granted since are claimed on it (:class:`~gpupool.nodeagent.kept_ledger.KeptLedger`,
which the DRA driver's prepare keeps too; built afresh when anything else changed). Property tests
compare both with the ledger built per check (``tests/nodeagent/test_schedule_check_shortcut.py``).

Card identity. An ``assignment-v1`` card (``CardRef``) is named by ``index``, the card's NVML index
on the node, and its uuid. The extender decides on *ledger positions*: the position of a card in its
node's inventory sorted by index (:func:`gpupool.api.annotations.decode_inventory`), translated to
``index`` by :meth:`Assignment.from_placement` and back by :meth:`Assignment.to_placement`. The node
agent's :class:`~gpupool.nodeagent.types.NodeAssignment` keeps the NVML index in ``CardSlice.card``.
:class:`NodeLedger` builds its one row the extender's way (the inventory's cards sorted by index, so
a position here is the extender's position for the same inventory) and converts at its edge
(:meth:`NodeLedger.position`); loans (``lendable``'s :class:`~gpupool.api.lending.LendableCard`) are
named by index and uuid too and are converted as the extender's ``card_loans`` converts them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpupool.api.annotations import foreign_assignment
from gpupool.api.lending import LendableCard
from gpupool.core import card_rule
from gpupool.core.card_rule import CardSlots, CardUse, CardVerdict, Demand
from gpupool.core.lent import LentVerdict, Loan, card_refusal
from gpupool.core.model import CardMode, CardSlice, ContainerAssignment, GpuCard, NodeSpec, Placement
from gpupool.core.state import ClusterState
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.nodeagent.container_grant import GrantError
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.types import PodView

if TYPE_CHECKING:  # the kept ledger is built on NodeLedger below
    from gpupool.nodeagent.kept_ledger import KeptLedger

#: The reason of the Warning event a refused pod gets.
REFUSED_REASON = "GpuAssignmentRefused"

PER_MILLE_PER_PERCENT = COMPUTE_PER_CARD // 100
"""``lendable`` speaks percent of a card, the core per-mille."""

LENT_OWNER_UNKNOWN = "(lent)"
"""``borrowed_from`` of a granted borrower the node books on a card it does not lend now."""


class AssignmentRefused(GrantError):
    """The node will not grant this assignment; the message says which card and why."""


class CardStateRefused(AssignmentRefused):
    """Refused because of a card itself (not on the node, or unhealthy): the view the assignment was
    decided from is stale, so the agent publishes its inventory again (the extender's next
    placement, e.g. of the replacement pod, then avoids the card)."""


@dataclass
class NodeLedger:
    """The core's ledger for this one node: the inventory as its only row, the granted pods claimed.

    ``cards``: the inventory's cards by ledger position (sorted by NVML index, as the extender
    reads the node's inventory annotation). ``holders`` / ``borrowers``: per position, the pods
    (``namespace/name``) an owner's or a borrower's grant holds there, for the refusal's sentence.
    """

    node: str
    state: ClusterState
    cards: tuple[GpuCard, ...]
    holders: dict[int, list[str]] = field(default_factory=dict)
    borrowers: dict[int, list[str]] = field(default_factory=dict)

    ROW = 0

    @staticmethod
    def of(node: str, inventory: GpuInventory) -> NodeLedger:
        cards = ledger_cards(inventory)
        state = ClusterState([NodeSpec(node, cpu_milli=0, memory_mib=0, cards=cards)], max_cards=max(1, len(cards)))
        return NodeLedger(node, state, cards)

    def position(self, index: int) -> int | None:
        """The ledger position of the card with NVML index ``index`` (None: not on this node)."""
        return position(self.cards, index)

    def placement(self, pod: PodView, borrowed_from: str | None = None) -> Placement | None:
        """``pod``'s assignment in ledger positions (None: it holds nothing here); slices on cards
        the node no longer has are left out (they hold nothing on this node's cards)."""
        if pod.terminated or pod.assignment is None or pod.assignment.placement.node not in ("", self.node):
            return None
        containers = []
        for c in pod.assignment.placement.containers:
            slices = []
            for s in c.slices:
                pos = self.position(s.card)
                if pos is not None:
                    slices.append(CardSlice(pos, s.memory_mib, s.compute, s.exclusive))
            containers.append(ContainerAssignment(c.container, tuple(slices), init=c.init))
        key = f"{pod.namespace}/{pod.name}"
        if key in self.state.placements:  # two views of one name (a replaced pod): both hold
            key = f"{key}@{pod.uid}"
        return Placement(key, self.node, 0, 0, tuple(containers), borrowed_from=borrowed_from)

    def claim(self, pod: PodView) -> None:
        """Book what an owner's grant holds, even beyond a card's capacity (the core's claim)."""
        placement = self.placement(pod)
        if placement is None:
            return
        self.state.claim(placement)
        for pos in placement.held_per_card():
            self.holders.setdefault(pos, []).append(f"{pod.namespace}/{pod.name}")

    def lend(self, loans: Iterable[LendableCard]) -> None:
        """Book this node's loans, named by NVML index and uuid; converted as the extender converts
        them (a card not in the inventory under that index and uuid lends nothing; the loan is at
        most the card)."""
        found: list[Loan] = []
        for lent in loans:
            pos = self.position(lent.index)
            if pos is None or self.cards[pos].uuid != lent.uuid:
                continue
            card = self.cards[pos]
            found.append(Loan(pos, lent.owner, min(lent.memory_mib, card.memory_mib),
                              min(lent.compute_percent * PER_MILLE_PER_PERCENT, card.compute)))
        self.state.set_loans(self.node, found)

    def claim_borrower(self, pod: PodView) -> None:
        """Book what a borrower's grant holds, against the loans of its cards."""
        first = self.placement(pod)
        if first is None:
            return
        loans = self.state.lent.loans(self.ROW)
        owner = next((loans[p].owner for p in sorted(first.held_per_card()) if p in loans), LENT_OWNER_UNKNOWN)
        placement = self.placement(pod, borrowed_from=owner)
        assert placement is not None
        self.state.claim(placement)
        for pos in placement.held_per_card():
            self.borrowers.setdefault(pos, []).append(f"{pod.namespace}/{pod.name}")

    def _names(self, held: dict[int, list[str]], pos: int) -> str:
        return ", ".join(held.get(pos, [])) or "no other pod"

    def _shares(self, pod: PodView, container: ContainerAssignment) -> list[tuple[int, int, Demand]]:
        return shares(self.cards, pod, container)

    def refuse_owner(self, pod: PodView, container: ContainerAssignment) -> None:
        """Raise :class:`AssignmentRefused` unless the core's card rule lets ``pod`` hold its share
        of each of ``container``'s cards beside what is claimed here."""
        for index, pos, demand in self._shares(pod, container):
            verdict = self.state.card_verdict(self.ROW, pos, demand)
            if verdict != CardVerdict.FITS:
                raise AssignmentRefused(self._owner_refusal(index, pos, verdict, demand))

    def _owner_refusal(self, index: int, pos: int, verdict: CardVerdict, demand: Demand) -> str:
        at = (self.ROW, pos)
        return owner_refusal(self.node, index, self.cards[pos], verdict, demand,
                             CardUse(self.state.card_mode[at], self.state.card_mem_free[at],
                                     self.state.card_compute_free[at]),
                             self._names(self.holders, pos))

    def refuse_borrower(self, pod: PodView, container: ContainerAssignment) -> None:
        """Raise :class:`AssignmentRefused` unless the core's lent rule lets borrower ``pod`` hold its
        share of each of ``container``'s cards: slices only, on a card lent now, within the loan's
        memory and compute less what the borrowers claimed here hold."""
        for index, pos, demand in self._shares(pod, container):
            at = (self.ROW, pos)
            slots = CardSlots(self.state.card_exists[at], self.state.card_healthy[at])
            verdict = self.state.lent.verdict(self.ROW, pos, slots, demand)
            if verdict != LentVerdict.FITS:
                raise AssignmentRefused(self._borrower_refusal(index, pos, verdict, slots, demand))

    def _borrower_refusal(self, index: int, pos: int, verdict: LentVerdict, slots: CardSlots,
                          demand: Demand) -> str:
        card, names = self.cards[pos], self._names(self.borrowers, pos)
        loan = self.state.lent.loan(self.ROW, pos)
        held_mib, held_milli = self.state.lent.borrowed(self.ROW, pos)
        if verdict == LentVerdict.CARD:
            return f"card {index} ({card.uuid}) on node {self.node}: {card_refusal(slots).name.lower()}"
        if verdict == LentVerdict.WHOLE_CARD:
            return (f"card {index} ({card.uuid}) is lent: a borrower takes slices of it, never the whole "
                    f"card (node {self.node})")
        if verdict == LentVerdict.NOT_LENT or loan is None:
            still = f"; its borrowers {names} stay until reclaimed" if self.borrowers.get(pos) else ""
            return f"card {index} ({card.uuid}) on node {self.node} is not lent now{still}"
        if verdict == LentVerdict.NO_LENT_MEMORY:
            return (f"card {index} ({card.uuid}) lent by {loan.owner} would be over-lent: {int(demand.memory)} MiB "
                    f"asked, {held_mib} MiB of the loan's {loan.memory_mib} MiB already granted to {names}")
        return (f"card {index} ({card.uuid}) lent by {loan.owner} would be over-lent: "
                f"{int(demand.compute) / 10:g} % compute asked, {held_milli / 10:g} % of the loan's "
                f"{loan.compute / 10:g} % already granted to {names}")


def ledger_cards(inventory: GpuInventory) -> tuple[GpuCard, ...]:
    """The inventory's cards by ledger position: sorted by NVML index, as the extender reads them."""
    return tuple(sorted(inventory.cards, key=lambda c: c.index))


def position(cards: tuple[GpuCard, ...], index: int) -> int | None:
    """The ledger position of the card with NVML index ``index`` among ``cards`` (None: not there)."""
    for pos, card in enumerate(cards):
        if card.index == index:
            return pos
    return None


def shares(cards: tuple[GpuCard, ...], pod: PodView, container: ContainerAssignment) -> list[tuple[int, int, Demand]]:
    """Per card of ``container`` (NVML index order): index, ledger position, what the whole pod
    holds there (its own init and app containers by the core's rule)."""
    assert pod.assignment is not None
    own = pod.assignment.placement.held_per_card()
    found = []
    for index in sorted({s.card for s in container.slices}):
        pos = position(cards, index)
        assert pos is not None  # checked by refuse_card_states
        mib, permille, exclusive = own.get(index, (0, 0, False))
        found.append((index, pos, Demand(mib, permille, exclusive)))
    return found


def owner_refusal(node: str, index: int, card: GpuCard, verdict: CardVerdict, demand: Demand, use: CardUse,
                  names: str) -> str:
    """The sentence of the card rule's refusal of ``demand`` on ``card``, in ``use`` now, whose
    holders are ``names``."""
    if verdict in (CardVerdict.NOT_IDLE, CardVerdict.EXCLUSIVE_HELD):
        return (f"card {index} ({card.uuid}) is exclusive to one pod but already granted "
                f"to {names} on node {node}")
    if verdict == CardVerdict.NO_MEMORY:
        used = card.memory_mib - int(use.mem_free)
        return (f"card {index} ({card.uuid}) would be over-committed: {int(demand.memory)} MiB asked, "
                f"{used} MiB of {card.memory_mib} MiB already granted to {names}")
    if verdict == CardVerdict.NO_COMPUTE:
        used = card.compute - int(use.compute_free)
        return (f"card {index} ({card.uuid}) would be over-committed: {int(demand.compute) / 10:g} % "
                f"compute asked, {used / 10:g} % already granted to {names}")
    return f"card {index} ({card.uuid}) on node {node}: {verdict.name.lower().replace('_', ' ')}"


def held_beside(node: str, others: Iterable[PodView], indexes: set[int]) -> bool:
    """Whether a grant of ``others`` holds anything on this node's cards of NVML ``indexes`` (a
    slice of any size counts: even an empty one makes an idle card shared)."""
    for other in others:
        if other.terminated or other.assignment is None or other.assignment.placement.node not in ("", node):
            continue
        for c in other.assignment.placement.containers:
            if any(s.card in indexes for s in c.slices):
                return True
    return False


def refuse_on_idle_cards(node: str, cards: tuple[GpuCard, ...], pod: PodView, container: ContainerAssignment) -> None:
    """:meth:`NodeLedger.refuse_owner` where no other grant holds ``container``'s cards: the core's
    card rule for each card as its ledger row would have it, idle and whole (its memory and compute
    free), without building the ledger."""
    for index, pos, demand in shares(cards, pod, container):
        card = cards[pos]
        use = CardUse(int(CardMode.IDLE), card.memory_mib, card.compute)
        verdict = card_rule.verdict(CardSlots(True, bool(card.healthy)), use, demand)
        if verdict != CardVerdict.FITS:
            raise AssignmentRefused(owner_refusal(node, index, card, verdict, demand, use, "no other pod"))


WHOLE_CARDS_ONLY = ("this node takes whole GPUs only: nothing on it can enforce a share (its agent has no "
                    "isolation backend; docs/isolation-backends.md)")


def refuse_slices(container: ContainerAssignment) -> None:
    """Raise :class:`AssignmentRefused` when ``container`` holds part of a card: on a node that
    cannot enforce shares, only whole cards are granted (an extender that read the node's notice
    places none; this catches one that did not)."""
    if any(not piece.exclusive for piece in container.slices):
        raise AssignmentRefused(f"container {container.container}: {WHOLE_CARDS_ONLY}")


def refuse_foreign(pod: PodView) -> None:
    """Raise :class:`AssignmentRefused` for an assignment decided for another pod (its ``podUID``; a
    pod replaced under the same name before the extender's Binding, which v1.20-v1.22 address by
    name only)."""
    if pod.assignment is not None:
        foreign = foreign_assignment(pod.assignment.pod_uid, pod.uid)
        if foreign is not None:
            raise AssignmentRefused(foreign)


def refuse_card_states(node: str, cards: tuple[GpuCard, ...], container: ContainerAssignment) -> None:
    """Raise :class:`CardStateRefused` when a card of ``container`` is not on the node or is
    unhealthy (the card rule's first checks, before any booking is looked at; ``cards``: the
    inventory's, :func:`ledger_cards`)."""
    for s in container.slices:
        pos = position(cards, s.card)
        if pos is None:
            raise CardStateRefused(f"card {s.card} is not on node {node} "
                                   f"(it has {sorted(c.index for c in cards)})")
        verdict = card_refusal(CardSlots(True, bool(cards[pos].healthy)))  # as the ledger's row has it
        if verdict != CardVerdict.FITS:
            raise CardStateRefused(f"card {s.card} ({cards[pos].uuid}) on node {node} is unhealthy")


def node_ledger(node: str, inventory: GpuInventory, granted: Iterable[PodView] = (),
                loans: Iterable[LendableCard] = (), borrowers: Iterable[PodView] = ()) -> NodeLedger:
    """The node's ledger: ``inventory``'s cards, ``granted`` owners' grants and ``borrowers``'
    grants claimed as the extender books them, ``loans`` (by NVML index) booked as it books them."""
    ledger = NodeLedger.of(node, inventory)
    for pod in granted:
        ledger.claim(pod)
    ledger.lend(loans)
    for pod in borrowers:
        ledger.claim_borrower(pod)
    return ledger


def check_assignment(node: str, inventory: GpuInventory, pod: PodView, container: ContainerAssignment,
                     granted: Iterable[PodView], kept: KeptLedger | None = None) -> None:
    """Raise :class:`AssignmentRefused` unless ``container``'s cards may be granted to ``pod``.

    ``granted``: the other pods of this node that hold grants on their owners' capacity (the pod
    itself is skipped; borrowers are left out by the caller: they count against their loans, see
    :func:`check_borrower`). An assignment decided for another pod is refused first, then a card
    that is missing or unhealthy (:class:`CardStateRefused`), then a share the core's card rule
    refuses beside what ``granted`` hold: on idle cards when no other grant holds the container's
    cards (:func:`refuse_on_idle_cards`, no ledger built), else on the node's ledger (``kept``: the
    agent's, kept between Allocates; None builds one for this check).
    """
    refuse_foreign(pod)
    cards = ledger_cards(inventory)
    refuse_card_states(node, cards, container)
    if pod.assignment is None:
        return
    others = [other for other in granted if other.uid != pod.uid]
    if not held_beside(node, others, {s.card for s in container.slices}):
        refuse_on_idle_cards(node, cards, pod, container)  # what the ledger below would say, unbuilt
        return
    if kept is not None:
        ledger = kept.ledger(inventory, others)
    else:
        ledger = NodeLedger.of(node, inventory)
        for other in others:
            ledger.claim(other)
    ledger.refuse_owner(pod, container)


def check_borrower(node: str, inventory: GpuInventory, pod: PodView, container: ContainerAssignment,
                   loans: Iterable[LendableCard], borrowers: Iterable[PodView]) -> None:
    """Raise :class:`AssignmentRefused` unless borrower ``pod`` may be granted ``container``'s cards
    by the core's lent rule (:func:`gpupool.core.lent.lent_verdict`, the extender's check of a
    placement with ``borrowed_from``): ``loans``, this node's loans now (as its ``lendable``
    annotation lists them); ``borrowers``, the borrowers granted on this node (the pod itself is
    skipped)."""
    refuse_foreign(pod)
    ledger = node_ledger(node, inventory, loans=loans)
    refuse_card_states(node, ledger.cards, container)
    if pod.assignment is None:
        raise AssignmentRefused(f"borrower {pod.namespace}/{pod.name} has no assignment-v1")
    for other in borrowers:
        if other.uid != pod.uid:
            ledger.claim_borrower(other)
    ledger.refuse_borrower(pod, container)
