"""The scheduler's per-node results for request shapes, each kept until its node changes.

Two kinds, because they depend on different parts of a request: whether a node can hold a pod
depends on its CPU, memory and GPU request, while a node-local policy's score ignores memory (the
scores look at a pod's CPU and GPU only). Pods that differ only in memory therefore share their
scores (the default openb trace's 151 request keys have 91 score shapes): a node that changed is
scored once for all of them, and a request seen for the first time costs a feasibility pass over
the cluster instead of a scoring pass when its scores are known.

Every row is stamped with :attr:`gpupool.core.state.ClusterState.node_version` at the time it was
computed (-1: never), so a row is current exactly when its stamp equals the node's version.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from gpupool.core.state import IntArray

SHAPES_KEPT = 256
"""Keys whose rows are kept per kind; card scopes (groups, pins, quota states) multiply the shapes,
so the oldest is dropped past this many."""


Value = TypeVar("Value", bound=np.generic)


class RowCache(Generic[Value]):
    """One key's value per node row and the node version each was computed at."""

    def __init__(self, size: int, fill: float | bool, dtype: type[Value], generation: int) -> None:
        self.version: IntArray = np.full(size, -1, dtype=np.int64)
        self.values: npt.NDArray[Value] = np.full(size, fill, dtype=dtype)
        self.generation = generation
        """Tells this entry from an earlier one of the same key (dropped since)."""
        self.bound = -1
        """For a feasibility entry: the generation of the score entry its feasible rows were
        scored into; when that entry is gone, so are the scores, and every row is recomputed."""

    def stale(self, node_version: IntArray) -> IntArray:
        """Rows computed at another version than the node's (``node_version``: the cluster's)."""
        rows: IntArray = (self.version != node_version).nonzero()[0]
        return rows


class RowCaches(Generic[Value]):
    """At most :data:`SHAPES_KEPT` keys' rows, the oldest entry dropped first."""

    def __init__(self, fill: float | bool, dtype: type[Value], kept: int = SHAPES_KEPT) -> None:
        self.fill = fill
        self.dtype = dtype
        self.kept = kept
        self._entries: dict[Hashable, RowCache[Value]] = {}
        self._generations = 0

    def entry(self, key: Hashable, size: int) -> RowCache[Value]:
        """The key's rows for a cluster of ``size`` rows; a fresh entry (nothing current) when the key
        is new or the cluster has grown since."""
        found = self._entries.get(key)
        if found is not None and len(found.version) == size:
            return found
        self._generations += 1
        fresh = RowCache(size, self.fill, self.dtype, self._generations)
        self._entries.pop(key, None)
        self._entries[key] = fresh
        if len(self._entries) > self.kept:
            self._entries.pop(next(iter(self._entries)))
        return fresh

    def __len__(self) -> int:
        return len(self._entries)
