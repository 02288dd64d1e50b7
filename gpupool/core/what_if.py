"""What-if copies of the ledger: hypothetical bookings on a private copy of a few nodes.

Why a copy: the extender's ledger is shared by filter, prioritize and bind threads, and its
versions drive their caches. A question such as "would this pod fit on the node if these victims
were evicted?" (preemption; later quotas and idle lending) must not lift and re-book real bookings
on it: every lift moves the versions the caches key on, a failure half-way through loses a booking,
and a reader that holds the lock between the steps sees a state that never existed. The copy holds
the nodes' descriptions, card health and bookings (over-committed claims included) and nothing of
the rest of the cluster, so building it costs one small ledger per question. A borrower
(:mod:`gpupool.core.lent`) is booked there like any holder of its cards: the question is about the
card as it is used, so evicting a borrower frees what it runs on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable

from gpupool.core.state import ClusterState


def what_if_copy(state: ClusterState, nodes: Iterable[str], *, without: Collection[str] = ()) -> ClusterState:
    """A new ledger holding the present ``nodes`` of ``state`` (unknown names are skipped) with
    every booking on them except those of the pods in ``without`` (borrowers' as plain claims).

    Card health is copied as the ledger has it (it can differ from the node's spec after
    :meth:`ClusterState.set_card_health`). Bookings are re-claimed in pod-key order, so two copies of
    the same ledger are equal.
    """
    present = [state.index[name] for name in dict.fromkeys(nodes)
               if name in state.index and state.present[state.index[name]]]
    copy = ClusterState((state.specs[row] for row in present), max_cards=state.max_cards)
    for row in present:
        spec = state.specs[row]
        mine = copy.index[spec.name]
        cards = len(spec.cards)
        copy.card_healthy[mine, :cards] = state.card_healthy[row, :cards]
        for key in sorted(state.pods_on.get(row, ())):
            if key not in without:
                copy.claim(dataclasses.replace(state.placements[key], borrowed_from=None))
    return copy
