"""Admission of connections to one port: a cap, and fair room for newcomers when it is reached.

Why not simply refuse what comes past the cap: then whoever opens the cap's worth of silent
connections first owns the port until their timeouts run out, and opens them again; a real client
would be turned away every time. Here a connection is *waiting* until it has shown it is a real
client (its first request's headers arrived, or its registration line) and *active* afterwards.
When the port is full, a newcomer takes the place of the oldest waiting connection, so silent
connections are dropped in the order they came and a client that speaks at once is never queued
behind them.

Why a short protection, counted in turns of the event loop and in time: a client accepted in one
turn has its first bytes read two or three turns later, and asyncio accepts up to the listen backlog
in one turn, so without protection one turn's newcomers could evict a real client accepted just
before them. A waiting connection is therefore evictable once :data:`PROTECTED_TURNS` turns in which
connections were admitted have passed since it was, or :data:`PROTECTED_S` (for quiet periods, when
no turn is counted). Both are far shorter than a flood's cycle, so an attacker who reconnects each
dropped connection at once cannot keep every place protected unless it opens the cap's worth of
connections within a few turns; only then, or when every place is active, is a newcomer refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

PROTECTED_TURNS = 4
PROTECTED_S = 0.05


@dataclass(eq=False)
class Admitted:
    """One connection the gate let in; ``close`` drops it (aborts its transport)."""

    close: Callable[[], None]
    since: float
    turn: int
    active: bool = False
    released: bool = False


@dataclass
class GateCounts:
    """What the gate did, for metrics and the summary log."""

    admitted: int = 0
    refused: int = 0
    evicted: int = 0
    timed_out: int = 0


class ConnectionGate:
    """Counts the open connections of one port and decides who gets a place. Event-loop only."""

    def __init__(self, max_connections: int, clock: Callable[[], float] = time.monotonic,
                 notify: Callable[[str], None] = lambda _kind: None) -> None:
        """``notify``: told "refused", "evicted" or "timed out" at each such event (a
        :class:`~gpupool.netguard.summary_log.SummaryLog` in the servers)."""
        if max_connections < 1:
            raise ValueError("a gate needs room for at least one connection")
        self.max_connections = max_connections
        self._clock = clock
        self._notify = notify
        self._open = 0
        self._waiting: dict[Admitted, None] = {}  # insertion order: the oldest first
        self._turn = 0
        self._tick_pending = False
        self.counts = GateCounts()

    @property
    def open(self) -> int:
        return self._open

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def tick(self) -> None:
        """A turn of the event loop with admissions has ended (scheduled by :meth:`admit`)."""
        self._tick_pending = False
        self._turn += 1

    def admit(self, close: Callable[[], None]) -> Admitted | None:
        """A place for a new connection (None: refused; the caller closes it). May evict the oldest
        waiting connection to make room (it is closed here)."""
        now = self._clock()
        self._count_turn()
        if self._open >= self.max_connections and not self._evict_oldest(now):
            self.counts.refused += 1
            self._notify("refused")
            return None
        self._open += 1
        self.counts.admitted += 1
        entry = Admitted(close, now, self._turn)
        self._waiting[entry] = None
        return entry

    def activate(self, entry: Admitted) -> None:
        """The connection spoke: it is no longer a candidate for eviction."""
        if not entry.active and not entry.released:
            entry.active = True
            self._waiting.pop(entry, None)

    def release(self, entry: Admitted) -> None:
        """The connection closed (whoever closed it); idempotent."""
        if entry.released:
            return
        entry.released = True
        self._open -= 1
        self._waiting.pop(entry, None)

    def time_out(self, entry: Admitted) -> None:
        """The connection missed its deadline: counted, released and closed."""
        if entry.released:
            return
        self.counts.timed_out += 1
        self._notify("timed out")
        self.release(entry)
        entry.close()

    def _count_turn(self) -> None:
        if self._tick_pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # driven by hand (tests call tick())
        self._tick_pending = True
        loop.call_soon(self.tick)

    def _evict_oldest(self, now: float) -> bool:
        oldest = next(iter(self._waiting), None)
        if oldest is None:
            return False
        if self._turn - oldest.turn < PROTECTED_TURNS and now - oldest.since < PROTECTED_S:
            return False
        self.counts.evicted += 1
        self._notify("evicted")
        self.release(oldest)  # its place is free now, before its transport reports the close
        oldest.close()
        return True
