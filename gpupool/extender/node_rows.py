"""Ledger rows of the node names kube-scheduler sends, and per-row facts, cached across calls.

Why: every filter and prioritize names up to 5,000 nodes, and kube-scheduler sends the same lists
call after call. Mapping them to ledger rows, and working out which rows serve a foreign alias, is
done once per list and ledger layout and then reused.

The *layout number* (:meth:`NodeRows.layout`) names which node each row is: it moves only when a
row's name changes (a node added, or the ledger replaced), not when a node's description changes,
so whoever keeps per-row data (the HTTP adapter's answer records) can key it by the number and
rebuild it only then.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

import numpy as np
import numpy.typing as npt

from gpupool.core.state import BoolArray, ClusterState, IntArray
from gpupool.extender.name_table import NameTable

RowsAndNames = tuple[IntArray, npt.NDArray[np.object_]]
REMEMBERED_LISTS = 8
"""Node lists remembered: filter's and prioritize's lists of a few pod shapes."""
TABLE_NAMES = 4096
"""Lists of at least this many names are mapped by the layout's :class:`NameTable`. Shorter ones
are looked up one name at a time: the table's fixed cost (some fifty numpy calls) made it slower
at 1,000 names and no faster at 2,000-3,000 (docs/performance.md, "The name mapping")."""


@dataclass(frozen=True)
class _RowsEntry:
    """A node list seen before, with its ledger rows."""

    names: list[str]
    state: ClusterState
    layout_version: int
    found: RowsAndNames


@dataclass(frozen=True)
class _Layout:
    """The row names of one ledger layout and their number."""

    state: ClusterState
    layout_version: int
    number: int
    names: tuple[str, ...]


class NodeRows:
    """Row lookups, alias masks and the layout number of one ledger."""

    def __init__(self) -> None:
        self._lists: list[_RowsEntry] = []
        self._layout: _Layout | None = None
        self._table: tuple[int, NameTable | None] | None = None
        """The name table of a layout number (None: it cannot have one), built the second time a
        long list meets that layout, so a layout that changes on every call never pays for it."""
        self._table_wanted = 0
        self._serving: dict[tuple[frozenset[str], int, int], BoolArray] = {}

    def rows(self, state: ClusterState, names: list[str]) -> RowsAndNames:
        """Ledger rows of ``names`` (-1 where unknown or removed) and the names as an array.

        A list is recognised by comparing it with the remembered ones (``==`` stops at the first
        differing name, or at once when the lengths differ), which is cheaper than hashing 5,000
        names as a key. The remembered lists are the request's own (never changed afterwards).
        Another long list is mapped by the layout's :class:`NameTable` (the same rows, found without
        a dictionary lookup per name), a short one, or one the table cannot answer, by the ledger's
        index.
        """
        for position, entry in enumerate(self._lists):
            if entry.state is state and entry.layout_version == state.layout_version and entry.names == names:
                if position:  # most recently used first: the full node list, asked by every filter, stays
                    self._lists.insert(0, self._lists.pop(position))
                return entry.found
        table = self._name_table(state) if len(names) >= TABLE_NAMES else None
        mapped = table.rows(names) if table is not None else None
        rows = mapped if mapped is not None else np.fromiter(map(state.index.get, names, repeat(-1)),
                                                           dtype=np.int64, count=len(names))
        known = rows >= 0
        known[known] = state.present[rows[known]]
        rows[~known] = -1
        found = (rows, np.array(names, dtype=object))
        self.remember(state, names, found)
        return found

    def _name_table(self, state: ClusterState) -> NameTable | None:
        """The name table of ``state``'s layout: built on the second asking for the same layout."""
        number = self.layout(state)
        if self._table is not None and self._table[0] == number:
            return self._table[1]
        if self._table_wanted != number:
            self._table_wanted = number
            return None
        names = self.names(number)
        self._table = (number, NameTable.of(names) if names is not None else None)
        return self._table[1]

    def remember(self, state: ClusterState, names: list[str], found: RowsAndNames) -> None:
        """Keep ``found`` as the rows of ``names`` (filter hands prioritize's list over this way).

        ``layout_version`` moves whenever a node is added, replaced or removed, so a remembered list
        is never used after one node left while another came back.
        """
        self._lists.insert(0, _RowsEntry(names, state, state.layout_version, found))
        del self._lists[REMEMBERED_LISTS:]

    def serving(self, state: ClusterState, aliases: frozenset[str], served: dict[str, frozenset[str]],
                served_version: int) -> BoolArray:
        """Per ledger row, does the node serve every alias in ``aliases``; kept until the ledger's
        nodes or their advertised aliases (``served_version``) change."""
        key = (aliases, state.layout_version, served_version)
        found = self._serving.get(key)
        if found is None:
            found = np.fromiter((aliases <= served.get(spec.name, frozenset()) for spec in state.specs),
                                dtype=bool, count=len(state.specs))
            self._serving = {key: found}
        return found

    def layout(self, state: ClusterState) -> int:
        """The layout number of ``state`` as it is now (see the module docstring)."""
        known = self._layout
        if known is None or known.state is not state or known.layout_version != state.layout_version:
            names = tuple(spec.name for spec in state.specs)
            if known is None or known.names != names:
                number = known.number + 1 if known is not None else 1
            else:  # a node replaced or removed keeps every row's name
                number = known.number
            known = _Layout(state, state.layout_version, number, names)
            self._layout = known
        return known.number

    def names(self, layout: int) -> tuple[str, ...] | None:
        """The node name of every row in layout ``layout``; None once the layout has moved on."""
        known = self._layout
        return known.names if known is not None and known.number == layout else None
