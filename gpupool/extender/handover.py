"""Bind permission across leadership hand-overs: a new leader binds only once its ledger is current.

Why: the ledger is fed by the watch, and a watch can lag. A replica that has just acquired the Lease
may not have seen the bookings the previous leader wrote in its last seconds; binding from that
ledger could give the same slice to a second pod. So each leadership term starts closed:

1. right after the Lease write that made this replica leader, the waiting GPU pods are fenced
   against binds of the previous leader that arrive late (a partition can hold them past its
   commit timeout; :mod:`gpupool.extender.takeover_fence`), then the pods are listed from etcd (a
   quorum read, :meth:`gpupool.extender.watch.ListWatch.catch_up`) and the ledger made at least
   that fresh. The previous leader's writes committed before that list or are refused (the lease
   timings and the commit timeout see to the first for a leader that dies, the fence to the second
   for one cut off, docs/extender.md "High availability"), so the list holds every one that counts;
2. only then does :meth:`Handover.admit` hand out tickets for this term; until then binds get
   :data:`CATCHING_UP`, a retryable error (kube-scheduler queues the pod again);
3. a bind holds its ticket and asks :meth:`Handover.holds` right before it writes the assignment;
   a term that ended (deadline passed, Lease lost, or lost and won again) writes nothing.

None of this adds an API call per bind: one list per term, two in-memory checks per bind.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

CATCHING_UP = ("gpupool extender: catching up after becoming leader (its ledger may lack the previous "
               "leader's last bookings); retry shortly")
NOT_LEADING = "gpupool extender: this replica is not the leader; retry shortly"
LOST_DURING_BIND = ("gpupool extender: this replica lost leadership during the bind; nothing was "
                    "written; retry shortly")


class Leadership(Protocol):
    """What the hand-over reads of leader election (:class:`gpupool.extender.lease.LeaderElector`)."""

    def leading_term(self) -> int | None:
        """The current term while leader, else None."""


class BindFence(Protocol):
    """What the binder asks before it binds and right before it writes an assignment."""

    def admit(self) -> int | None:
        """A ticket (the term) when this replica may bind now, else None."""

    def holds(self, ticket: int) -> bool:
        """Whether the ticket's term is still the current one and still led."""

    def refusal(self) -> str:
        """Why :meth:`admit` refuses now (empty when it would not)."""


class Unfenced:
    """The fence of a single replica (``--no-leader-elect``): always admitted, never revoked."""

    def admit(self) -> int | None:
        return 0

    def holds(self, ticket: int) -> bool:
        return True

    def refusal(self) -> str:
        return ""


def _daemon(target: Callable[[], None]) -> None:
    threading.Thread(target=target, name="gpupool-handover", daemon=True).start()


class Handover:
    """The :class:`BindFence` of a leader-elected replica: open per term once the ledger caught up."""

    def __init__(self, leadership: Leadership, catch_up: Callable[[], object], *,
                 stop: threading.Event | None = None, retry_s: float = 1.0,
                 spawn: Callable[[Callable[[], None]], None] = _daemon,
                 fence: Callable[[int], object] | None = None) -> None:
        self.leadership = leadership
        self.catch_up = catch_up
        self.fence = fence
        """Run with the term before each catch-up (:class:`gpupool.extender.takeover_fence.TakeoverFence`);
        an exception keeps the term closed and is retried like a failed list."""
        self.stop = stop or threading.Event()
        self.retry_s = retry_s
        self.spawn = spawn
        self._caught_up: int | None = None  # the term whose ledger caught up
        self.caught_up_listeners: list[Callable[[], object]] = []
        """Called on the catch-up thread once a term's ledger caught up (the wake-up adopts the
        pods still waiting); a failing listener is logged and does not close the term."""

    def started_leading(self) -> None:
        """Hook for the elector: a new term began; catch up on a thread of its own.

        Not on the elector's thread: a list of every pod can take seconds on a large cluster, and
        renewals must go on meanwhile.
        """
        term = self.leadership.leading_term()
        if term is not None:
            self.spawn(lambda: self._catch_up(term))

    def _catch_up(self, term: int) -> None:
        """Fence and list until both succeed or the term ends; then open the term."""
        while not self.stop.is_set() and self.leadership.leading_term() == term:
            try:
                if self.fence is not None:
                    self.fence(term)
                self.catch_up()
            except Exception as exc:  # the API is down or slow: stay closed and try again
                log.warning("catching up after becoming leader (term %d): %s: %s; retrying",
                            term, type(exc).__name__, exc)
                self.stop.wait(self.retry_s)
                continue
            if self.leadership.leading_term() == term:
                self._caught_up = term
                log.info("ledger caught up for leadership term %d: binding", term)
                for listener in self.caught_up_listeners:
                    try:
                        listener()
                    except Exception:  # the term is open; a listener's failure must not undo that
                        log.exception("after catching up (term %d)", term)
            return

    def admit(self) -> int | None:
        term = self.leadership.leading_term()
        return term if term is not None and term == self._caught_up else None

    def holds(self, ticket: int) -> bool:
        return self.leadership.leading_term() == ticket

    def refusal(self) -> str:
        term = self.leadership.leading_term()
        if term is None:
            return NOT_LEADING
        return "" if term == self._caught_up else CATCHING_UP
