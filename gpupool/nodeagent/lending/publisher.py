"""Publishing the node's lendable cards on its Node object, at most once per interval.

The annotation is what the extender places borrowers by, so it must never offer a card that is
being taken back: a card leaving the set is published at once (after its reclaim stopped the
borrowers), a card joining it waits for the interval (a flapping idle card costs at most one write
per interval).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from gpupool.api.lending import Lendable, LendableCard, encode_lendable

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 2.0
RETRY_S = 1.0

WriteAnnotation = Callable[[str | None], Awaitable[None]]
"""Writes the annotation's value onto the node (``None`` removes it)."""


class LendablePublisher:
    """Keeps the node's ``lendable`` annotation equal to the offered cards."""

    def __init__(self, write: WriteAnnotation, *, min_interval_s: float = MIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self._write = write
        self._interval = min_interval_s
        self._clock = clock
        self._wall = wall
        self._wanted: tuple[LendableCard, ...] = ()
        self._published: tuple[LendableCard, ...] | None = None
        self._last = float("-inf")
        self._wake = asyncio.Event()
        self.writes = 0

    def offer(self, cards: Iterable[LendableCard]) -> None:
        """The cards lendable now (the loop writes them)."""
        self._wanted = tuple(sorted(cards, key=lambda c: c.index))
        self._wake.set()

    def due_in(self) -> float:
        """Seconds until the wanted set may be written (0: now); ``inf`` when nothing changed."""
        if self._wanted == self._published:
            return float("inf")
        if self._published is None or set(self._published) - set(self._wanted):  # an offer withdrawn: now
            return 0.0
        return max(0.0, self._last + self._interval - self._clock())

    async def publish_now(self) -> None:
        """Write the wanted set (a removal path calls this directly)."""
        cards = self._wanted
        value = encode_lendable(Lendable(self._wall(), cards)) if cards else None
        await self._write(value)
        self._published, self._last = cards, self._clock()
        self.writes += 1

    async def run(self) -> None:
        """Write whenever due, until cancelled; a failed write is retried."""
        while True:
            wait = self.due_in()
            if wait > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):  # not wait_for: it can swallow a cancellation (3.11)
                    async with asyncio.timeout(None if wait == float("inf") else wait):
                        await self._wake.wait()
                continue
            try:
                await self.publish_now()
            except Exception as exc:
                log.warning("could not publish the lendable cards: %s", exc)
                await asyncio.sleep(RETRY_S)
