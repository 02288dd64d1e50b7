"""The cluster's fragmentation % after every pod of a packing replay, measured in batches.

Why batches: the report averages fragmentation over the pods of each arrived-demand bin, so it is
needed after every pod, but each placement changes one node. Measuring that node right away is one
small vectorised pass per pod, whose fixed numpy cost was about a tenth of a replay. Instead the
node's free compute per card and CPU are copied when the pod is placed (a few microseconds), and the
copies of :data:`BATCH` placements are measured in one pass; the running cluster totals are then
replayed in arrival order, so every pod gets the value it would have had.

A packing replay books pods and nothing else: cards neither appear, vanish nor change health, so
which cards count (existing and healthy) is read once at the start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.fragmentation import FragmentationMeasure
from gpupool.core.state import BoolArray, ClusterState, IntArray

BATCH = 256
"""Placements measured together: large enough that the per-call cost vanishes, small enough that
the copies stay a few tens of kilobytes."""


@dataclass(frozen=True)
class PodOutcome:
    """What the recorder needs of one pod: the arrived and allocated milli-GPU after it, and the
    fragmentation % once measured."""

    arrived: int
    used: int
    fragmentation_pct: float


class FragmentLog:
    """Running cluster fragmentation and idle GPU, refreshed for the node each placement changed."""

    def __init__(self, state: ClusterState, measure: FragmentationMeasure) -> None:
        self.state = state
        self.measure = measure
        all_rows = np.arange(state.size, dtype=np.int64)
        self.usable: BoolArray = state.card_exists & state.card_healthy
        free = np.where(self.usable, state.card_compute_free, 0)
        self.node_frag = measure.fragment_of(all_rows, free, state.cpu_free)
        self.node_idle: IntArray = free.sum(axis=1)
        # Running sums: summing every node after each pod cost more than the pass itself; the float
        # drift over a replay is far below the report's 4 decimals.
        self.frag_total, self.idle_total = float(self.node_frag.sum()), int(self.node_idle.sum())
        self._rows: list[int] = []
        self._free: IntArray = np.zeros((BATCH, state.max_cards), dtype=np.int64)
        self._cpu: IntArray = np.zeros(BATCH, dtype=np.int64)
        self._pods: list[tuple[int, int, int]] = []  # arrived, used, batch slot or -1 (nothing placed)

    def record(self, arrived: int, used: int, row: int | None) -> list[PodOutcome]:
        """Note one pod (``row``: the node it was placed on, None if it failed); returns the outcomes
        of the pods measured by this call (none until a batch is full)."""
        slot = -1
        if row is not None:
            slot = len(self._rows)
            self._rows.append(row)
            self._free[slot] = self.state.card_compute_free[row]
            self._cpu[slot] = self.state.cpu_free[row]
        self._pods.append((arrived, used, slot))
        return self.flush() if len(self._rows) == BATCH else []

    def flush(self) -> list[PodOutcome]:
        """Measure the nodes noted since the last flush; the outcomes of their pods, in order."""
        count = len(self._rows)
        rows = np.array(self._rows, dtype=np.int64)
        free = np.where(self.usable[rows], self._free[:count], 0)
        frags = self.measure.fragment_of(rows, free, self._cpu[:count]).tolist()
        idles = free.sum(axis=1).tolist()
        outcomes: list[PodOutcome] = []
        for arrived, used, slot in self._pods:
            if slot >= 0:
                row = self._rows[slot]
                frag, idle = frags[slot], idles[slot]
                self.frag_total += frag - float(self.node_frag[row])
                self.idle_total += idle - int(self.node_idle[row])
                self.node_frag[row], self.node_idle[row] = frag, idle
            pct = 100.0 * self.frag_total / self.idle_total if self.idle_total else 0.0
            outcomes.append(PodOutcome(arrived, used, pct))
        self._rows.clear()
        self._pods.clear()
        return outcomes
