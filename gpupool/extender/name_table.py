"""Ledger rows of many node names at once, from the names' bytes, without a dictionary lookup per name.

Why: every filter names up to 5,000 nodes, decoded afresh from the request, and kube-scheduler
v1.37 sends them in a new order every cycle, so no memo of whole lists helps. A dictionary lookup
per name costs hashing the fresh string and then, for each name, memory far apart: the dictionary's
entry, the ledger's own string to compare with, its row's ``int``. On a busy machine that
made the mapping a third of the filter's CPU at 5,000 nodes (docs/performance.md, "The name
mapping").

Here the names are joined into one byte string (a copy in C) and handled as arrays: each name's
polynomial hash comes from a prefix sum over the bytes, the hashes are looked up in an open
addressing table of the ledger's names (a few vectorised probes), and every name found is then
compared byte for byte with the ledger's name of that row. The answer is therefore exact, never a
guess from a hash: a name is given a row only if its bytes equal that row's name, and a name the
table does not find cannot be a ledger name (equal bytes give equal hashes).

:meth:`NameTable.rows` answers None where it cannot answer exactly and cheaply (a name that is
not ASCII or holds a newline, a list longer than :data:`MAX_BYTES`, two names whose bytes differ
but whose hashes are equal, ledger names too uneven in length to pad); the caller then looks the
names up one by one, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpupool.core.state import IntArray

U64 = npt.NDArray[np.uint64]
BASE = 0x9E3779B97F4A7C15
"""The hash's odd multiplier (odd, so its powers have inverses modulo 2**64)."""
MAX_BYTES = 1 << 21
"""Longest joined list handled (2 MiB: 10,000 names of 200 characters); longer ones answer None,
so the power tables stay at most 32 MiB."""
SEPARATOR = 10
"""The byte between joined names (newline, which no node name holds)."""


def _inverse(odd: int) -> int:
    """The inverse of ``odd`` modulo 2**64 (Newton's iteration doubles the correct bits each step)."""
    x = odd
    for _ in range(6):
        x = x * (2 - odd * x) % (1 << 64)
    return x


class _Powers:
    """``BASE**k`` and ``BASE**-k`` modulo 2**64 for k below a size grown on demand (the pair is
    replaced as one, so a thread never sees one table grown and the other not)."""

    def __init__(self) -> None:
        self._tables: tuple[U64, U64] = (np.ones(1, dtype=np.uint64), np.ones(1, dtype=np.uint64))

    def upto(self, size: int) -> tuple[U64, U64]:
        tables = self._tables
        if len(tables[0]) < size:
            grown = 1 << max(16, (size - 1).bit_length())
            tables = (self._cumulative(BASE, grown), self._cumulative(_inverse(BASE), grown))
            self._tables = tables
        return tables

    @staticmethod
    def _cumulative(factor: int, size: int) -> U64:
        powers = np.full(size, factor, dtype=np.uint64)
        powers[0] = 1
        return np.cumprod(powers, dtype=np.uint64)  # wraps modulo 2**64, as wanted


_POWERS = _Powers()


class _Joined:
    """Names joined with :data:`SEPARATOR` as bytes, with where each starts and how long it is."""

    def __init__(self, raw: bytes, starts: IntArray, lengths: IntArray) -> None:
        self.raw = raw
        self.data = np.frombuffer(raw, dtype=np.uint8)
        self.starts = starts
        self.lengths = lengths

    @classmethod
    def of(cls, names: Sequence[str]) -> _Joined | None:
        """None when the names cannot be joined unambiguously as ASCII bytes (see the module doc)."""
        joined = "\n".join(names)
        if not names or len(joined) >= MAX_BYTES or not joined.isascii():
            return None
        raw = joined.encode("ascii")
        separators = np.flatnonzero(np.frombuffer(raw, dtype=np.uint8) == SEPARATOR)
        if len(separators) != len(names) - 1:  # a name holds a newline
            return None
        starts = np.empty(len(names), dtype=np.int64)
        starts[0] = 0
        starts[1:] = separators + 1
        ends = np.empty(len(names), dtype=np.int64)
        ends[:-1] = separators
        ends[-1] = len(raw)
        return cls(raw, starts, ends - starts)

    def hashes(self) -> U64:
        """Each name's ``sum(byte[k] * BASE**k) + length`` modulo 2**64."""
        up, down = _POWERS.upto(len(self.data) + 1)
        prefix = np.empty(len(self.data) + 1, dtype=np.uint64)
        prefix[0] = 0
        summed = prefix[1:]
        np.multiply(self.data, up[:len(self.data)], out=summed)
        np.cumsum(summed, out=summed)
        starts = self.starts
        hashes: U64 = (prefix[starts + self.lengths] - prefix[starts]) * down[starts]
        return hashes + self.lengths.astype(np.uint64)


class NameTable:
    """The rows of one ledger layout's names (row ``i`` is ``names[i]``), for :meth:`rows`."""

    def __init__(self, joined: _Joined, hashes: U64) -> None:
        bits = max(4, (4 * len(hashes) - 1).bit_length())  # at most a quarter of the slots taken
        self._shift = np.uint64(64 - bits)
        self._mask = (1 << bits) - 1
        self._slot_hash = np.zeros(1 << bits, dtype=np.uint64)
        self._slot_row = np.full(1 << bits, -1, dtype=np.int64)
        pending = np.arange(len(hashes))
        slots = (hashes >> self._shift).astype(np.int64)
        while len(pending):  # linear probing, one round per displacement
            wanted = slots[pending]
            free = self._slot_row[wanted] < 0
            _, first = np.unique(wanted, return_index=True)  # one name per slot per round
            placed = np.zeros(len(pending), dtype=bool)
            placed[first] = True
            placed &= free
            self._slot_row[wanted[placed]] = pending[placed]
            self._slot_hash[wanted[placed]] = hashes[pending[placed]]
            pending = pending[~placed]
            slots[pending] = (slots[pending] + 1) & self._mask
        # each row's name and a separator, left-aligned in a row of bytes: a list's rows gathered
        # and read up to each separator give the bytes the list's names must be
        self._widths = joined.lengths + 1
        columns = int(self._widths.max())
        self._columns = np.arange(columns)
        self._spelled = np.zeros((len(hashes), columns), dtype=np.uint8)
        owner = np.repeat(np.arange(len(hashes)), self._widths)
        column = np.arange(len(owner)) - np.repeat(joined.starts, self._widths)
        self._spelled[owner, column] = np.append(joined.data, np.uint8(SEPARATOR))

    @classmethod
    def of(cls, names: Sequence[str]) -> NameTable | None:
        """The table of ``names`` (the ledger's row names), or None when one cannot be built: a name
        that cannot be joined (module doc), two names with one hash, or names so uneven in length
        that the table's rows would hold mostly padding."""
        joined = _Joined.of(names)
        if joined is None:
            return None
        hashes = joined.hashes()
        if len(np.unique(hashes)) != len(hashes):
            return None
        if (int(joined.lengths.max()) + 1) * len(names) > 4 * (len(joined.data) + 1):
            return None
        return cls(joined, hashes)

    def rows(self, names: Sequence[str]) -> IntArray | None:
        """The row of each of ``names`` (-1 where the ledger has no such name), or None when this
        cannot be told here (the caller looks the names up one by one)."""
        asked = _Joined.of(names)
        if asked is None:
            return None
        hashes = asked.hashes()
        slots = (hashes >> self._shift).astype(np.int64)
        rows = self._slot_row[slots]  # most names sit in their first slot
        taken = rows >= 0
        hit = taken & (self._slot_hash[slots] == hashes)
        rows[~hit] = -1
        todo = np.flatnonzero(taken & ~hit)
        slots[todo] = (slots[todo] + 1) & self._mask
        while len(todo):
            slot = slots[todo]
            row = self._slot_row[slot]
            taken = row >= 0
            hit = taken & (self._slot_hash[slot] == hashes[todo])
            rows[todo[hit]] = row[hit]
            todo = todo[taken & ~hit]
            slots[todo] = (slots[todo] + 1) & self._mask
        return rows if self._spelled_alike(asked, rows) else None

    def _spelled_alike(self, asked: _Joined, rows: IntArray) -> bool:
        """Is every name given a row spelled exactly as that row's name?

        The rows' names, each followed by a separator, are gathered into one byte string and
        compared with the asked names joined the same way; as no name holds a separator, equal
        strings mean equal names one by one."""
        found = rows >= 0
        if found.all():
            given, raw = rows, asked.raw
        elif not found.any():
            return True
        else:  # only the names found are compared (rare: kube-scheduler names nodes the ledger lacks)
            given = rows[found]
            keep = np.repeat(found, asked.lengths + 1)[:-1]
            raw = asked.data[keep].tobytes()
            if not found[-1]:
                raw = raw[:-1]  # the kept names' bytes end with a separator here
        widths = self._widths[given]
        if int(widths.sum()) != len(raw) + 1:
            return False
        spelled = self._spelled[given][self._columns < widths[:, None]]
        return spelled.tobytes()[:-1] == raw
