"""Log lines a client can cause, at most one per interval with a count of the rest.

Why: a refused connection or registration is worth a line when it is the odd misconfigured client,
but a flood of them (14,031 WARNING lines in 3 minutes in the probe of issue 28) buries everything
else and costs the disk and CPU the flood wanted to take. The first event of an interval is logged
in full; the others are counted by kind and told in one summary line when the interval ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

DEFAULT_INTERVAL_S = 60.0


class SummaryLog:
    """``note(kind, message)``: the message now, or a count in the next summary line."""

    def __init__(self, log: logging.Logger, what: str, level: int = logging.WARNING,
                 interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._what = what
        self._level = level
        self._interval_s = interval_s
        self._clock = clock
        self._since: float | None = None
        self._held: Counter[str] = Counter()
        self._flush_handle: asyncio.TimerHandle | None = None
        self.lines = 0
        """Lines written (tests check the rate by it)."""

    def note(self, kind: str, message: str, *args: object) -> None:
        """One event; ``message % args`` is formatted only when the line is written."""
        now = self._clock()
        if self._since is not None and now - self._since >= self._interval_s:
            self.flush()
        if self._since is None:
            self._since = now
            self._emit(message, *args)
            return
        self._held[kind] += 1
        self._flush_later(self._since + self._interval_s - now)

    def flush(self) -> None:
        """Write the summary of the held events, if any, and start a new interval."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._held:
            counts = ", ".join(f"{kind}: {n}" for kind, n in sorted(self._held.items()))
            self._emit("%d more %s in the last %g s (%s)", sum(self._held.values()), self._what,
                       self._interval_s, counts)
        self._held.clear()
        self._since = None

    def _emit(self, message: str, *args: object) -> None:
        self.lines += 1
        self._log.log(self._level, message, *args)

    def _flush_later(self, delay_s: float) -> None:
        """On an event loop, the summary comes when the interval ends even if nothing follows."""
        if self._flush_handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: the next note() or an explicit flush() writes it
        self._flush_handle = loop.call_later(max(delay_s, 0.0), self.flush)
