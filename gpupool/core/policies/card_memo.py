"""Per-card scores of a slice shape, kept from scoring the nodes until the card is chosen.

Why: a fragmentation policy scores every card of every candidate node to score the nodes, and then,
once a node is chosen, its card chooser needs the same per-card scores of that one node. Computing
them again costs about as much as scoring a few nodes (numpy's fixed cost per call), on every slice
a replay places. The scores of a node depend only on its bookings, which
:attr:`gpupool.core.state.ClusterState.node_version` stamps, so scores remembered at the node's
current version are the ones the chooser would compute. A node scored alone and among others can
differ in the last bit of a matrix product; the replays checked in docs/simulator.md ("Speed") make
the same decisions either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.fragmentation import FloatArray
from gpupool.core.model import GpuRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray

SHAPES_REMEMBERED = 256
"""Slice shapes whose per-card scores are kept; the least recently scored goes first."""

MemoKey = tuple[int, GpuRequest]
"""A slice shape as the card chooser sees it: the pod's CPU and its GPU request."""


@dataclass
class _Scores:
    version: IntArray
    scores: FloatArray


class CardScoreMemo:
    """The last per-card scores of every node for each slice shape, stamped with the node's version."""

    def __init__(self, capacity: int = SHAPES_REMEMBERED) -> None:
        self.capacity = capacity
        self._state: ClusterState | None = None
        self._entries: dict[MemoKey, _Scores] = {}

    def store(self, state: ClusterState, key: MemoKey, rows: IntArray, scores: FloatArray,
              fits: BoolArray) -> None:
        """Remember ``scores`` (``[rows, cards]``) of ``rows`` at their current versions; ``fits``
        marks the cards that were scored (the others are remembered as not scored)."""
        if state is not self._state:
            self._state, self._entries = state, {}
        entry = self._entries.pop(key, None)
        size, cards = state.size, state.max_cards
        if entry is None or entry.scores.shape != (size, cards):
            entry = _Scores(np.full(size, -1, dtype=np.int64), np.full((size, cards), -np.inf))
        self._entries[key] = entry  # most recently scored last
        if len(self._entries) > self.capacity:
            self._entries.pop(next(iter(self._entries)))
        entry.scores[rows] = np.where(fits, scores, -np.inf)
        entry.version[rows] = state.node_version[rows]

    def copy_rows(self, state: ClusterState, key: MemoKey, source: IntArray, target: IntArray) -> None:
        """Remember for ``target`` what is remembered for ``source`` (pairwise; nodes in the same state,
        :mod:`gpupool.core.row_groups`), stamped with the targets' current versions."""
        entry = self._entries.get(key) if state is self._state else None
        if entry is None or entry.scores.shape != (state.size, state.max_cards):
            return
        entry.scores[target] = entry.scores[source]
        entry.version[target] = np.where(entry.version[source] == state.node_version[source],
                                         state.node_version[target], -1)

    def lookup(self, state: ClusterState, key: MemoKey, row: int, mask: BoolArray) -> FloatArray | None:
        """The remembered scores of node ``row``'s cards, or None when they are not current or some
        card of ``mask`` was not scored (it did not fit the request then)."""
        entry = self._entries.get(key) if state is self._state else None
        if entry is None or row >= len(entry.version) or entry.version[row] != state.node_version[row]:
            return None
        scores: FloatArray = entry.scores[row]
        if not np.isfinite(scores[mask]).all():
            return None
        return scores
