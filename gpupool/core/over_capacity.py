"""Which cards of a node hold more than they have: the check behind claims the ledger books anyway.

Apart from :mod:`gpupool.core.state` because it walks a node's placements in Python (the extender
asks it after a claim, and after a release from an over-committed card; never on the booking path,
nor on the node agent's, whose claims of its grants do not ask) and counts owners only: borrowers
(:mod:`gpupool.core.lent`) count against the card's loan, not against the card.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpupool.core.state import ClusterState


def cards_over_capacity(state: ClusterState, node: str) -> tuple[int, ...]:
    """Card positions of ``node`` whose owners' bookings add up to more than the card has: memory or
    compute beyond its total, or a whole-card holder sharing the card with anyone."""
    row = state.index.get(node)
    if row is None or not state.present[row]:
        return ()
    memory: dict[int, int] = {}
    compute: dict[int, int] = {}
    holders: dict[int, int] = {}
    whole: set[int] = set()
    for key in state.pods_on.get(row, ()):
        placement = state.placements[key]
        if placement.borrowed_from is not None:
            continue
        for card, (mib, milli, exclusive) in placement.held_per_card().items():
            memory[card] = memory.get(card, 0) + mib
            compute[card] = compute.get(card, 0) + milli
            holders[card] = holders.get(card, 0) + 1
            if exclusive:
                whole.add(card)
    return tuple(sorted(
        card for card in holders
        if memory[card] > state.card_mem_total[row, card]
        or compute[card] > state.card_compute_total[row, card]
        or (card in whole and holders[card] > 1)))
