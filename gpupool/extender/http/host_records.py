"""Answers that list thousands of nodes, written as one numpy row gather from per-node records.

Why: filter answers ``NodeNames`` and prioritize answers a ``HostPriorityList`` for every node
kube-scheduler asked about (5,000 in the benchmark), twice per pod. Joining per-host byte strings in
Python touches thousands of scattered objects per answer, slow in a server whose caches are full of
ledger data; here every node's JSON is prepared once per ledger layout in one contiguous table, each
record padded with spaces to one width, and an answer is ``table[rows]`` plus two digit columns, an
order of magnitude faster (docs/extender.md, "Session 4"). JSON allows whitespace between tokens, so
a padded record is still exact JSON and decodes to the same values (Go's decoder, which
kube-scheduler uses, included).

A record of the priority table reads ``{"Host":"node-7",  "Score":10},`` (the two score characters
are `` 0``..``10``); a record of the name table reads ``"node-7"  ,``. The trailing comma of the
last record is replaced by the closing bracket.

When one node's name is much longer than the rest, padding every record to it would bloat each
answer; the table is then not built (:meth:`HostRecords.build` returns None) and the caller writes
the answer its slower, compact way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import orjson

from gpupool.extender.service import NodeScores

NamesOfLayout = Callable[[int], "tuple[str, ...] | None"]
"""The service's :meth:`~gpupool.extender.service.ExtenderService.row_names`: the node name of every
ledger row in a numbered layout, or None once the layout has moved on."""

ByteTable = npt.NDArray[np.uint8]

_SPACE = ord(" ")
_SCORE_TAIL = b'"Score":00},'
_TENS: ByteTable = np.array([_SPACE] * 10 + [ord("1")], dtype=np.uint8)
_UNITS: ByteTable = (ord("0") + np.arange(11) % 10).astype(np.uint8)
MAX_PADDING = 1.5
"""A table is built only if padding grows an answer listing every node by at most this factor."""


def _table(records: Sequence[bytes], tail: bytes) -> ByteTable:
    """One row per record: the record, spaces, then ``tail`` ending at the last column.

    Built by numpy's fixed-width bytes type, which pads each record with NUL bytes; the NULs then
    become spaces. A record never holds a NUL of its own (orjson writes control characters as
    ``\\u0000`` escapes). A row-by-row copy is an order of magnitude slower than this fixed-width
    build.
    """
    width = max(map(len, records), default=0) + len(tail)
    if not records:
        return np.zeros((0, width), dtype=np.uint8)
    table = np.array(records, dtype=f"S{width}").view(np.uint8).reshape(len(records), width)
    table[table == 0] = _SPACE
    table[:, width - len(tail):] = np.frombuffer(tail, dtype=np.uint8)
    return table


def _as_list(gathered: ByteTable) -> bytes:
    """``[`` + the records + ``]`` (the last record's trailing comma becomes the bracket)."""
    if not len(gathered):
        return b"[]"
    gathered[-1, -1] = ord("]")
    return b"[" + gathered.tobytes()


class HostRecords:
    """The priority and name records of every node of one ledger layout, by ledger row."""

    def __init__(self, priority: ByteTable, names: ByteTable) -> None:
        self._priority = priority
        self._names = names

    @classmethod
    def build(cls, row_names: Sequence[str]) -> HostRecords | None:
        """Records for the nodes ``row_names`` (by row); None when padding would grow answers more
        than :data:`MAX_PADDING`."""
        quoted = [orjson.dumps(name) for name in row_names]  # orjson escapes any name correctly
        if not quoted:
            return cls(_table([], _SCORE_TAIL), _table([], b","))
        compact = sum(map(len, quoted))
        if (max(map(len, quoted)) * len(quoted)) > MAX_PADDING * compact:
            return None
        priority = _table([b'{"Host":' + name + b"," for name in quoted], _SCORE_TAIL)
        names = _table(quoted, b",")
        return cls(priority, names)

    def priority_list(self, rows: npt.NDArray[np.int64], scores: npt.NDArray[np.int64]) -> bytes:
        """``HostPriorityList`` JSON: ``scores[i]`` (0..10) for the node of ``rows[i]``."""
        gathered = self._priority[rows]
        width = gathered.shape[1]
        gathered[:, width - 4] = _TENS[scores]
        gathered[:, width - 3] = _UNITS[scores]
        return _as_list(gathered)

    def name_list(self, rows: npt.NDArray[np.int64]) -> bytes:
        """A JSON list of the names of ``rows``, in that order."""
        return _as_list(self._names[rows])


class RecordsForLayout:
    """Keeps the :class:`HostRecords` of the latest ledger layout and answers from it when it can.

    This is the adapter's own name → record table: the service's answers carry ledger rows and the
    number of the layout they index, and ``names_of`` gives that layout's row names, so the table is
    built once per layout number (a node added) and never read with rows of another layout.
    """

    def __init__(self, names_of: NamesOfLayout) -> None:
        self._names_of = names_of
        self._records: HostRecords | None = None
        self._layout: int | None = None

    def for_layout(self, layout: int | None) -> HostRecords | None:
        """The records of layout ``layout`` (built on first use), or None when there are none."""
        if layout is None:
            return None
        if self._layout != layout:
            names = self._names_of(layout)
            if names is None:  # the ledger has moved on since the answer: write this one compactly
                return None
            self._records = HostRecords.build(names)
            self._layout = layout
        return self._records

    def priority_list(self, scores: NodeScores) -> bytes | None:
        """``scores`` as ``HostPriorityList`` JSON, or None when it must be written another way
        (no rows, a layout with no records, or a score outside 0..10)."""
        records = self.for_layout(scores.layout)
        if records is None or scores.rows is None or len(scores.rows) != len(scores.hosts):
            return None
        values = scores.scores
        if len(values) and (values.min() < 0 or values.max() > 10):
            return None
        return records.priority_list(scores.rows, values)

    def name_list(self, names: Sequence[str], rows: npt.NDArray[np.int64] | None,
                  layout: int | None) -> bytes | None:
        """``names`` (the nodes of ``rows``) as a JSON list, or None when it must be written another way."""
        records = self.for_layout(layout)
        if records is None or rows is None or len(rows) != len(names):
            return None
        return records.name_list(rows)
