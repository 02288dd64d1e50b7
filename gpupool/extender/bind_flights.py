"""One bind per pod at a time: a bind that arrives while another of the same pod runs waits for it.

Why: kube-scheduler sends a bind again once the first has passed its timeout, and the first may
still be running (the apiserver stalled). The ledger keeps one reservation per pod, so two binds of
one pod interleaved would each lift and give back the other's reservation, leaving a card that is
taken in the API looking free until the watch catches up. Run one after the other, a repeat that
asks exactly what the running bind was asked gets its answer (the bind is idempotent), and any
other bind of the pod starts afresh from what the first left behind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Result = TypeVar("Result")


@dataclass
class _Flight(Generic[Result]):
    """The bind of one pod that is running now, and what it was asked."""

    ask: Hashable
    done: threading.Event = field(default_factory=threading.Event)
    result: Result | None = None


@dataclass(frozen=True)
class Outcome(Generic[Result]):
    """What :meth:`PodFlights.run` gives back.

    ``result`` is None when the wait for a running bind of the pod ran out; ``shared`` says that
    the result is the running bind's (the caller asked the same thing and did no work itself).
    """

    result: Result | None
    shared: bool = False


class PodFlights(Generic[Result]):
    """Serialises work per pod key; an identical request joins the one in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, _Flight[Result]] = {}

    def run(self, key: str, ask: Hashable, wait_s: Callable[[], float],
            work: Callable[[], Result]) -> Outcome[Result]:
        """Run ``work`` for ``key`` once no other work for ``key`` runs.

        While another runs, wait for it (at most ``wait_s()`` seconds each time): if it was asked
        ``ask`` too and produced a result, return that result; otherwise run ``work`` after it.
        """
        while True:
            with self._lock:
                flight = self._running.get(key)
                if flight is None:
                    mine: _Flight[Result] = _Flight(ask)
                    self._running[key] = mine
            if flight is None:
                return Outcome(self._fly(key, mine, work))
            if not flight.done.wait(max(0.0, wait_s())):
                return Outcome(None)
            if flight.ask == ask and flight.result is not None:
                return Outcome(flight.result, shared=True)

    def _fly(self, key: str, flight: _Flight[Result], work: Callable[[], Result]) -> Result:
        try:
            flight.result = work()
            return flight.result
        finally:
            with self._lock:
                del self._running[key]
            flight.done.set()
