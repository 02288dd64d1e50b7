"""How well a node can connect the cards of a multi-card pod: a small rise of its score.

Tencent GPUManager's rule chooses, *within* a node, the card set with the least communication cost
(:func:`gpupool.core.cards.cheapest_card_set`). Without a term in the node score, that rule never
reaches the choice of the node: two nodes the policy scores equal are taken in node order, so a
4-card job lands on a node that can only give it cards across sockets while another could give an
NVLink set. This term lets every policy prefer the better-connected node between nodes it scores
the same, and never more: it stays below one step of the policies' scores (all of them integers,
apart from spread's CPU tie-break and random's draws).

A node that publishes no topology is flat: every pair of its cards is at ``SYSTEM`` level, the
worst, and gets no rise. On a trace without topology the term is zero everywhere and placements are
unchanged.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from gpupool.core.cards import cheapest_card_set
from gpupool.core.fragmentation import FloatArray
from gpupool.core.model import LinkLevel, NodeSpec
from gpupool.core.state import BoolArray, ClusterState, IntArray

TOPOLOGY_WEIGHT = 0.5
"""The most the term adds (a set linked at ``SELF`` level, never reached): half of one integer step
of the policies' scores, so it orders only nodes they score equal."""


def set_cost(spec: NodeSpec, cards: list[int]) -> int:
    """Sum of the link levels of every pair of ``cards`` (card positions of ``spec``)."""
    return sum(int(spec.link(a, b)) for a, b in itertools.combinations(cards, 2))


def worst_cost(count: int) -> int:
    """The cost of ``count`` cards that are all ``SYSTEM`` apart (a flat node, across sockets)."""
    return int(LinkLevel.SYSTEM) * math.comb(count, 2)


def topology_rise(state: ClusterState, count: int, rows: IntArray, fits: BoolArray) -> FloatArray:
    """Per row, ``TOPOLOGY_WEIGHT`` times how much cheaper than the worst the best ``count``-card set
    among the row's fitting cards is (0 for single cards, flat nodes and rows without enough cards)."""
    rise = np.zeros(len(rows))
    if count < 2:
        return rise
    worst = worst_cost(count)
    for i, row in enumerate(rows.tolist()):
        spec = state.specs[row]
        if spec.topology is None:
            continue
        candidates = [int(c) for c in np.flatnonzero(fits[i])]
        if len(candidates) < count:
            continue
        cost = set_cost(spec, cheapest_card_set(spec, candidates, count))
        rise[i] = TOPOLOGY_WEIGHT * (worst - cost) / worst
    return rise
