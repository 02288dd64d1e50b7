"""The ledger's storage: one array per quantity, a row per node and a column per card slot.

Kept apart from the bookkeeping in :mod:`gpupool.core.state` because growing the arrays is its own
job with its own invariant: the public arrays are views of larger buffers, swapped in whole, so a
failed allocation leaves every array as it was.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpupool.core.card_rule import BoolArray, IntArray


class LedgerArrays:
    """Per-node and per-card arrays of the ledger, grown geometrically as nodes are added."""

    def __init__(self, max_cards: int) -> None:
        self.max_cards = max_cards
        self.node_version: IntArray = np.zeros(0, dtype=np.int64)
        self.present: BoolArray = np.zeros(0, dtype=bool)
        self.cpu_total: IntArray = np.zeros(0, dtype=np.int64)
        self.cpu_free: IntArray = np.zeros(0, dtype=np.int64)
        self.mem_total: IntArray = np.zeros(0, dtype=np.int64)
        self.mem_free: IntArray = np.zeros(0, dtype=np.int64)
        self.card_count: IntArray = np.zeros(0, dtype=np.int64)
        self._alloc_card_arrays(0, max_cards)
        self._storage: dict[str, npt.NDArray[np.generic]] = {
            name: getattr(self, name) for name in (*self._NODE_ARRAYS, *self._CARD_ARRAYS)}

    def _alloc_card_arrays(self, rows: int, cols: int) -> None:
        shape = (rows, cols)
        self.card_exists: BoolArray = np.zeros(shape, dtype=bool)
        self.card_healthy: BoolArray = np.zeros(shape, dtype=bool)
        self.card_model: IntArray = np.full(shape, -1, dtype=np.int64)
        self.card_virtual: BoolArray = np.zeros(shape, dtype=bool)
        self.card_mem_total: IntArray = np.zeros(shape, dtype=np.int64)
        self.card_mem_free: IntArray = np.zeros(shape, dtype=np.int64)
        self.card_compute_total: IntArray = np.zeros(shape, dtype=np.int64)
        self.card_compute_free: IntArray = np.zeros(shape, dtype=np.int64)
        self.card_mode: IntArray = np.zeros(shape, dtype=np.int64)
        self.card_holders: IntArray = np.zeros(shape, dtype=np.int64)

    _NODE_ARRAYS = ("node_version", "present", "cpu_total", "cpu_free", "mem_total", "mem_free",
                    "card_count")
    _CARD_ARRAYS = ("card_exists", "card_healthy", "card_model", "card_virtual", "card_mem_total",
                    "card_mem_free", "card_compute_total", "card_compute_free", "card_mode",
                    "card_holders")

    def _grow(self, rows: int, cols: int) -> None:
        """Make the arrays ``rows`` long and at least ``cols`` wide, keeping current contents.

        The public arrays are views of the first ``rows`` rows of larger buffers that grow
        geometrically, so adding nodes one at a time (watch events, a re-list) copies each row a
        constant number of times on average; a full copy per added node would make single adds
        quadratic in the cluster's size. Rows never shrink: a removed node keeps its row, not
        present.
        """
        old_rows = len(self.present)
        old_cols = self.card_exists.shape[1] if self.card_exists.ndim == 2 else 0
        if rows <= old_rows and cols <= old_cols:
            return
        rows, cols = max(rows, old_rows), max(cols, old_cols)
        allocated = len(self._storage["present"])
        if rows > allocated or cols > old_cols:
            capacity = max(rows, 2 * allocated, 16) if rows > allocated else allocated
            grown: dict[str, npt.NDArray[np.generic]] = {}  # swapped in whole: a failed allocation changes nothing
            for name in self._NODE_ARRAYS:
                old = self._storage[name]
                grown[name] = np.zeros(capacity, dtype=old.dtype)
                grown[name][:old_rows] = old[:old_rows]
            for name in self._CARD_ARRAYS:
                old = self._storage[name]
                fill = -1 if name == "card_model" else 0
                grown[name] = np.full((capacity, cols), fill, dtype=old.dtype)
                grown[name][:old_rows, :old_cols] = old[:old_rows, :old_cols]
            self._storage = grown
        for name, buffer in self._storage.items():
            setattr(self, name, buffer[:rows])
        self.max_cards = cols
