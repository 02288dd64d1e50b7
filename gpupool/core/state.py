"""The allocation ledger: what every card of every node has free, kept as arrays.

Why arrays: the same ledger serves the simulator (tens of thousands of decisions over a 1,213-node
cluster) and the extender (filter + prioritize over 5,000 nodes within milliseconds). Keeping each
quantity as an ``N x G`` array (nodes x card slots) lets feasibility and scoring run vectorised over
all nodes at once, while :meth:`ClusterState.apply` is the single place that books resources and
refuses anything that would over-commit a card or share an exclusive one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpupool.core import card_rule
from gpupool.core.card_rule import BoolArray, CardBook, CardSlots, CardUse, CardVerdict, Demand, IntArray
from gpupool.core.card_scope import CardScope, ScopeMasks
from gpupool.core.ledger_arrays import LedgerArrays
from gpupool.core.ledger_row import NodeRow
from gpupool.core.lent import LentBook, Loan
from gpupool.core.model import CardMode, NodeSpec, Placement
from gpupool.core.over_capacity import cards_over_capacity
from gpupool.core.usage import UsageTally, placement_use

__all__ = ["AllocationError", "BoolArray", "Capacity", "CardUsage", "ClusterState", "IntArray"]


class AllocationError(ValueError):
    """A placement that the ledger refuses; the message says which card or node and why."""


@dataclass(frozen=True)
class CardUsage:
    """A read-only view of one card's bookkeeping, for reasons, metrics and annotations."""

    node: str
    card: int
    memory_total: int
    memory_free: int
    compute_total: int
    compute_free: int
    mode: CardMode
    healthy: bool


@dataclass(frozen=True)
class Capacity:
    """Cluster-wide maxima that decide whether a request could fit on *any* node, bookings aside."""

    has_cards: bool
    largest_card_mib: int
    most_cards: int


class ClusterState(LedgerArrays):
    """Nodes, their cards, and every placement booked on them.

    Invariants (checked by property tests): for every card ``0 <= free <= total`` in memory and
    compute; an ``EXCLUSIVE`` card is held by exactly one pod; a ``SHARED`` card holds only slices.
    """

    def __init__(self, nodes: Iterable[NodeSpec] = (), max_cards: int = 8) -> None:
        super().__init__(max_cards)
        self.specs: list[NodeSpec] = []
        self.index: dict[str, int] = {}
        self.models: list[str] = []
        self._model_ids: dict[str, int] = {}
        self.placements: dict[str, Placement] = {}
        self.pods_on: dict[int, set[str]] = {}
        self.version = 0
        """Bumped by every change of any node's bookings or description (see :attr:`node_version`)."""
        self.layout_version = 0
        """Bumped when a node is added, replaced or removed; bookings do not change it."""
        self._capacity_memo: tuple[int, Capacity] | None = None
        self.usage = UsageTally()
        """Per tenant and GPU model, what the booked placements hold (quotas count from it)."""
        self._scope_masks = ScopeMasks()
        self.lent = LentBook()
        """Loans of lent cards and what borrowers hold on them (:mod:`gpupool.core.lent`)."""
        self.add_nodes(nodes)

    def scope_mask(self, scope: CardScope) -> BoolArray:
        """``[nodes, cards]``: the cards ``scope`` admits (read-only, kept per node layout)."""
        return self._scope_masks.mask(self, scope)

    def scope_reach(self, scope: CardScope) -> BoolArray:
        """``[nodes]``: the nodes with a card ``scope`` admits (read-only, kept per node layout)."""
        return self._scope_masks.reach(self, scope)

    def model_id(self, model: str) -> int:
        """A stable small integer for a GPU model name (so model filters are array compares)."""
        found = self._model_ids.get(model)
        if found is None:
            found = len(self.models)
            self.models.append(model)
            self._model_ids[model] = found
        return found

    def model_ids(self, models: Iterable[str]) -> list[int]:
        """Ids of the known models among ``models`` (unknown ones match no card)."""
        return [self._model_ids[m] for m in models if m in self._model_ids]

    # ------------------------------------------------------------------------------- membership
    def add_nodes(self, specs: Iterable[NodeSpec]) -> list[int]:
        """Add (or replace) many nodes with one allocation; returns their rows, in order.

        A full node list (start, re-list after 410 Gone) arrives at once: growing the arrays to
        the final size first means no row is copied more than once, whatever the list's length.
        All or nothing: every node is converted for the arrays before the first one is written, so
        a node the ledger cannot hold raises and leaves the ledger as it was.
        """
        staged = [NodeRow.of(spec) for spec in specs]
        fresh = len({s.spec.name for s in staged if s.spec.name not in self.index})
        widest = max((s.card_count for s in staged), default=0)
        self._grow(self.size + fresh, max(self.max_cards, widest))
        return [self._write_node(node) for node in staged]

    def capacity(self) -> Capacity:
        """Largest card, most cards on one node, any card at all: over present nodes, memoised.

        These change only when a node is added, replaced or removed (:attr:`layout_version`), never
        when a pod is booked, so the per-request check of :func:`request_problem` costs a lookup
        instead of a scan of every card of the cluster.
        """
        memo = self._capacity_memo
        if memo is not None and memo[0] == self.layout_version:
            return memo[1]
        present = self.card_exists & self.present[:, None]
        has_cards = bool(present.any())
        summary = Capacity(
            has_cards=has_cards,
            largest_card_mib=int(self.card_mem_total[present].max()) if has_cards else 0,
            most_cards=int(self.card_count[self.present].max()) if self.present.any() else 0,
        )
        self._capacity_memo = (self.layout_version, summary)
        return summary

    def upsert_node(self, spec: NodeSpec) -> int:
        """Add a node or replace its description; bookings already on it are kept and re-applied.

        Re-applying matters after an inventory change (a card lost, a restart of the node side):
        free capacity is always derived as total minus what placements hold, never patched.
        All or nothing: the description is converted for the arrays first, so a value the ledger
        cannot hold raises ``ValueError`` before anything changes (a half-written node would look
        unchanged to the caller's retry and never be repaired).
        """
        staged = NodeRow.of(spec)
        self._grow(self.size + (spec.name not in self.index), max(self.max_cards, staged.card_count))
        return self._write_node(staged)

    def _write_node(self, node: NodeRow) -> int:
        """Write a converted node into its row (the arrays are already wide enough); cannot fail."""
        spec = node.spec
        row = self.index.get(spec.name)
        if row is None:
            row = len(self.specs)
            self.specs.append(spec)
            self.index[spec.name] = row
        else:
            self.specs[row] = spec
        self.layout_version += 1
        self.present[row] = True
        self.cpu_total[row] = node.cpu_milli
        self.mem_total[row] = node.memory_mib
        self.card_count[row] = node.card_count
        count = node.card_count
        self.card_exists[row, :count] = True
        self.card_exists[row, count:] = False
        self.card_healthy[row, :count] = node.healthy
        self.card_healthy[row, count:] = False
        self.card_model[row, :count] = [self.model_id(model) for model in node.models]
        self.card_model[row, count:] = -1
        self.card_virtual[row, :count] = node.virtual
        self.card_virtual[row, count:] = False
        self.card_mem_total[row, :count] = node.card_memory_mib
        self.card_mem_total[row, count:] = 0
        self.card_compute_total[row, :count] = node.card_compute
        self.card_compute_total[row, count:] = 0
        self._recompute_node(row)
        return row

    def remove_node(self, name: str) -> list[Placement]:
        """Forget a node; returns (and drops) the placements that were on it."""
        row = self.index.get(name)
        if row is None:
            return []
        dropped = [p for p in self.placements.values() if p.node == name]
        for p in dropped:
            del self.placements[p.pod_key]
            self.usage.remove(p.pod_key)
        self.pods_on.pop(row, None)
        self.lent.forget_row(row)
        self.layout_version += 1
        self.present[row] = False
        self.card_exists[row, :] = False
        self.card_healthy[row, :] = False
        self.cpu_total[row] = self.cpu_free[row] = 0
        self.mem_total[row] = self.mem_free[row] = 0
        self._touch(row)
        return dropped

    def set_card_health(self, node: str, card: int, healthy: bool) -> None:
        """Mark a card (un)healthy: an unhealthy card takes no new slices but keeps its bookings."""
        row = self.index[node]
        if not self.card_exists[row, card]:
            raise AllocationError(f"node {node} has no card {card}")
        self.card_healthy[row, card] = healthy
        self._touch(row)

    def _recompute_node(self, row: int) -> None:
        self.cpu_free[row] = self.cpu_total[row]
        self.mem_free[row] = self.mem_total[row]
        self.card_mem_free[row, :] = self.card_mem_total[row, :]
        self.card_compute_free[row, :] = self.card_compute_total[row, :]
        self.card_mode[row, :] = CardMode.IDLE
        self.card_holders[row, :] = 0
        for key in self.pods_on.get(row, ()):  # this node's placements only, not all of them
            self._book(row, self.placements[key], sign=1)
            self.usage.add(key, placement_use(self.placements[key], self.specs[row]))
        self._touch(row)

    def _touch(self, row: int) -> None:
        self.version += 1
        self.node_version[row] = self.version

    @property
    def size(self) -> int:
        """Number of node rows (including removed nodes, whose ``present`` is False)."""
        return len(self.specs)

    # ---------------------------------------------------------------------------------- booking
    def check(self, placement: Placement, scope: CardScope | None = None) -> str | None:
        """Why ``placement`` cannot be booked now, or None when it can (``scope``: the cards the
        request that chose it may use; a card outside it is refused as the card rule refuses it)."""
        row = self.index.get(placement.node)
        if row is None or not self.present[row]:
            return f"node {placement.node} is not known"
        if placement.pod_key in self.placements:
            return f"pod {placement.pod_key} already holds a placement"
        if placement.cpu_milli > self.cpu_free[row]:
            return (f"node {placement.node}: {placement.cpu_milli}m CPU requested, "
                    f"{int(self.cpu_free[row])}m free")
        if placement.memory_mib > self.mem_free[row]:
            return (f"node {placement.node}: {placement.memory_mib} MiB memory requested, "
                    f"{int(self.mem_free[row])} MiB free")
        in_scope = self.scope_mask(scope)[row] if scope is not None else None
        if placement.borrowed_from is not None:  # a borrower's slices count against the loans
            return self.lent.refusal(placement.node, row, placement.held_per_card(), self.card_exists[row],
                                     self.card_healthy[row], in_scope)
        for card, (memory, compute, exclusive) in placement.held_per_card().items():
            demand = Demand(memory, compute, exclusive)
            verdict = self.card_verdict(row, card, demand, in_scope)
            if verdict != CardVerdict.FITS:
                return self._refusal(placement.node, row, card, verdict, demand)
        return None

    def card_verdict(self, row: int, card: int, demand: Demand, in_scope: BoolArray | None = None) -> CardVerdict:
        """The card rule (:mod:`gpupool.core.card_rule`) for one card of node ``row``; ``in_scope``:
        the row of a scope mask (:meth:`scope_mask`) when the request has a card scope."""
        if not 0 <= card < self.max_cards:
            return CardVerdict.NO_CARD
        at = (row, card)
        scoped = None if in_scope is None else in_scope[card]
        return card_rule.verdict(CardSlots(self.card_exists[at], self.card_healthy[at], in_scope=scoped),
                                 CardUse(self.card_mode[at], self.card_mem_free[at], self.card_compute_free[at]),
                                 demand)

    def _refusal(self, node: str, row: int, card: int, verdict: CardVerdict, demand: Demand) -> str:
        """The ledger's sentence for a card that refuses a held share."""
        if verdict == CardVerdict.NO_CARD:
            return f"node {node} has no card {card}"
        if verdict == CardVerdict.UNHEALTHY:
            return f"node {node} card {card} is unhealthy"
        if verdict == CardVerdict.OUT_OF_SCOPE:
            return f"node {node} card {card} is outside the cards the pod may use"
        if verdict == CardVerdict.NOT_IDLE:
            return f"node {node} card {card} is in use; a whole-card request needs it idle"
        if verdict == CardVerdict.EXCLUSIVE_HELD:
            return f"node {node} card {card} is held exclusively"
        if verdict == CardVerdict.NO_MEMORY:
            return (f"node {node} card {card}: {demand.memory} MiB requested, "
                    f"{int(self.card_mem_free[row, card])} MiB free")
        return (f"node {node} card {card}: compute {demand.compute}/1000 requested, "
                f"{int(self.card_compute_free[row, card])}/1000 free")

    def apply(self, placement: Placement, scope: CardScope | None = None) -> None:
        """Book a placement, or raise :class:`AllocationError` and change nothing."""
        reason = self.check(placement, scope)
        if reason is not None:
            raise AllocationError(reason)
        self._hold(self.index[placement.node], placement)

    def _hold(self, row: int, placement: Placement) -> None:
        """Book a checked (or claimed) placement and count it for its tenant."""
        self._book(row, placement, sign=1)
        self.usage.add(placement.pod_key, placement_use(placement, self.specs[row]))
        self.placements[placement.pod_key] = placement
        self.pods_on.setdefault(row, set()).add(placement.pod_key)
        self._touch(row)

    def release(self, pod_key: str) -> Placement | None:
        """Give back what a pod holds; unknown pods are ignored (deletes can repeat)."""
        placement = self.placements.pop(pod_key, None)
        if placement is None:
            return None
        self.usage.remove(pod_key)
        row = self.index.get(placement.node)
        if row is not None:
            self.pods_on.get(row, set()).discard(pod_key)
        if row is not None and self.present[row]:
            self._book(row, placement, sign=-1)
            self._touch(row)
        return placement

    def _book(self, row: int, placement: Placement, sign: int) -> None:
        self.cpu_free[row] -= sign * placement.cpu_milli
        self.mem_free[row] -= sign * placement.memory_mib
        if placement.borrowed_from is not None:  # booked against the loans, not the owners' amounts
            self.lent.book(row, placement.pod_key, placement.held_per_card(), sign)
            return
        cards = CardBook(self.card_mem_total, self.card_mem_free, self.card_compute_total,
                         self.card_compute_free, self.card_mode, self.card_holders)
        for card, (memory, compute, exclusive) in placement.held_per_card().items():
            cards.book((row, card), memory, compute, exclusive, sign)

    # ------------------------------------------------------------------------------------ views
    def card_usage(self, node: str) -> list[CardUsage]:
        """Per-card bookkeeping of one node."""
        row = self.index[node]
        return [
            CardUsage(
                node=node,
                card=pos,
                memory_total=int(self.card_mem_total[row, pos]),
                memory_free=int(self.card_mem_free[row, pos]),
                compute_total=int(self.card_compute_total[row, pos]),
                compute_free=int(self.card_compute_free[row, pos]),
                mode=CardMode(int(self.card_mode[row, pos])),
                healthy=bool(self.card_healthy[row, pos]),
            )
            for pos in range(int(self.card_count[row]))
        ]

    def allocated_compute(self) -> int:
        """Compute booked over the whole cluster, per-mille (the trace's allocated milli-GPU)."""
        used = (self.card_compute_total - self.card_compute_free)[self.card_exists]
        return int(used.sum())

    def total_compute(self) -> int:
        """Compute of every existing card, per-mille."""
        return int(self.card_compute_total[self.card_exists].sum())

    def node_names(self, rows: Sequence[int] | npt.NDArray[np.int64]) -> list[str]:
        return [self.specs[int(r)].name for r in rows]

    # ------------------------------------------------------------------------------------ claims
    def claim(self, placement: Placement) -> None:
        """Book what the cluster already holds, even beyond a card's capacity. A caller that acts on
        cards over capacity asks :meth:`over_capacity` afterwards: the check walks every placement
        of the node in Python, and most claims have no use for it (the node agent claims each pod it
        granted and judges new slices by the cards' free space alone).

        Why apart from :meth:`apply`: a bound pod holds the cards its assignment names whatever the
        ledger thinks, and an older version or a hand edit can leave two pods claiming more than a
        card has. Refusing the second claim would hide it: its space would be offered to the next
        pod, and once the first claimant left the card would look emptier than it is. Booked
        anyway, the card's free memory or compute goes below zero (or a whole-card holder shares
        it), so every fit rule refuses it new slices until enough claimants have left. Releasing a
        claim from a card that is over capacity does not restore its mode exactly: re-derive the
        node afterwards (:meth:`upsert_node` with its spec). Raises :class:`AllocationError`,
        booking nothing, for an unknown node or card or a pod that already holds a placement.
        """
        row = self.index.get(placement.node)
        if row is None or not self.present[row]:
            raise AllocationError(f"node {placement.node} is not known")
        if placement.pod_key in self.placements:
            raise AllocationError(f"pod {placement.pod_key} already holds a placement")
        for card in placement.held_per_card():
            if card < 0 or card >= self.max_cards or not self.card_exists[row, card]:
                raise AllocationError(f"node {placement.node} has no card {card}")
        self._hold(row, placement)

    def over_capacity(self, node: str) -> tuple[int, ...]:
        """Card positions of ``node`` whose bookings add up to more than the card has: memory or
        compute beyond its total, or a whole-card holder sharing the card with anyone (borrowers
        aside: they count against the card's loan)."""
        return cards_over_capacity(self, node)

    def set_loans(self, node: str, loans: Iterable[Loan]) -> None:
        """Replace what the present node ``node`` lends (:mod:`gpupool.core.lent`); borrowers stay."""
        row = self.index[node]
        if self.lent.set_loans(row, loans):
            self._touch(row)
