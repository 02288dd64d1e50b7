"""Whether a pod read from the API may join the pod store: the watch stays authoritative.

Why a read must join it: :class:`~gpupool.nodeagent.pod_cache.NodePodCache` reads a pod from the
API as its last resort (kubelet lists it, the watch has not brought it in time). Whoever the watch
feeds must then see that pod too, or Allocate acts on a pod they never heard of: the lending side
would key a ReplicaSet's replacement's checkpoint directory by ``namespace/name`` instead of its
controller (it starts over, and its checkpoints are never found by the next pod), take a borrower
for an owner, and leave the owner's loan unshrunk at its grant.

Why a read must not simply join it: the read races the watch. It may return a version the watch
replaced, or a pod the watch has since deleted, and handing that on would bring the pod back in
the lending side's pods and the container directory until the next list.

The rule: a read is handed on only when the watch holds no record of the pod and said nothing
about it (no event for it, no list at all) while the read was in flight; afterwards the watch's
events replace it as they replace each other. A read that began after the watch's last word on the
pod is a quorum GET, so it is at least that new (a pod the watch saw deleted reads as missing, or
as a new pod under the old name); one the watch spoke over is dropped, and the watch's word stands.
A re-list during a read drops it too: the list may be older than the read, but it cannot say
whether the pod was deleted after the read, and the watch resumes from it without saying so.

Every method is called with :attr:`PodReadGate.lock` held: the cache holds it while it records a
list or event, hands it to the feeds and posts it to the store (the watch's thread), and while it
checks and hands on a read (the event loop), so the two never interleave.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from gpupool.nodeagent.node_pod import PodKey


@dataclass
class ReadTicket:
    """One API read in flight; ``spoken`` once the watch said anything about its pod meanwhile."""

    key: PodKey
    spoken: bool = False


class PodReadGate:
    """What the watch has handed on (the keys it holds) and the reads in flight beside it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._held: set[PodKey] = set()
        self._reads: dict[PodKey, list[ReadTicket]] = {}

    # ------------------------------------------------------------------ the watch's word
    def listed(self, keys: Iterable[PodKey]) -> None:
        """A full list: the watch holds exactly ``keys``; every read in flight was spoken over."""
        self._held = set(keys)
        for tickets in self._reads.values():
            for ticket in tickets:
                ticket.spoken = True

    def said(self, key: PodKey, gone: bool) -> None:
        """One event about ``key`` (``gone``: deleted, or no longer on this node)."""
        if gone:
            self._held.discard(key)
        else:
            self._held.add(key)
        for ticket in self._reads.get(key, ()):
            ticket.spoken = True

    # ------------------------------------------------------------------ reads
    def begin(self, key: PodKey) -> ReadTicket:
        """A read of ``key`` starts (before the request is sent)."""
        ticket = ReadTicket(key)
        self._reads.setdefault(key, []).append(ticket)
        return ticket

    def end(self, ticket: ReadTicket) -> bool:
        """The read is over; True when what it found may be handed on (:meth:`handed_on`)."""
        tickets = self._reads[ticket.key]
        tickets.remove(ticket)
        if not tickets:
            del self._reads[ticket.key]
        return not ticket.spoken and ticket.key not in self._held

    def handed_on(self, key: PodKey) -> None:
        """A read's pod was handed to the store and the feeds: held as if the watch had brought it."""
        self._held.add(key)

    def holds(self, key: PodKey) -> bool:
        """Whether the pod was handed on and not since deleted (tests, diagnostics)."""
        return key in self._held

    def reads_in_flight(self) -> int:
        return sum(len(tickets) for tickets in self._reads.values())
