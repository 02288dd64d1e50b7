"""Which nodes' agents are alive: the extender's view of the node agents' Leases.

Every node agent renews ``gpupool-agent-<node>`` (:mod:`gpupool.nodeagent.heartbeat`). A node
whose agent stopped renewing still has its ``inventory-v1`` and its free cards in the ledger, but
nothing on the node would answer kubelet's Allocate: a GPU pod placed there fails admission. So
filter refuses such a node, with the reason, until its Lease is renewed again
(:meth:`AgentLiveness.refusals`, read by :class:`gpupool.extender.service.ExtenderService`).

Lapse is judged as the node lifecycle controller and client-go's leader election judge it: on this
process's monotonic clock, from when a *renewal* (a new ``renewTime``) was observed, not by comparing
the agent's wall clock with ours. The one exception is the first sighting (after a start or a
re-list of a Lease not seen before): there the Lease's ``renewTime`` may only make it *older* than
"just renewed", so an extender started next to an agent that died an hour ago does not trust that
node for a whole Lease duration; an agent whose clock runs behind is refused at most until its next
renewal arrives.

Cost on the hot path: filter asks on every call; lapses are found from a heap of deadlines, so a call
where no Lease lapsed since the last one costs O(1) whatever the number of nodes, and the reasons
are written only for the (few) nodes refused.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from gpupool.api.agent_lease import lapsed_reason, lease_node, missing_reason, renewed_ago
from gpupool.core.state import ClusterState

log = logging.getLogger(__name__)

NO_REFUSALS: Mapping[str, str] = {}


@dataclass(frozen=True)
class _Beat:
    """The last renewal of one node's Lease as this process saw it."""

    renew_time: str
    """The Lease's ``renewTime`` text: a new value is a renewal (a label edit is not)."""
    observed_at: float
    """Our monotonic time of the renewal (backdated on a first sighting, see the module doc)."""
    duration_s: float


class AgentLiveness:
    """Agent Leases → per-node refusals; fed by a list+watch, read by filter (thread-safe)."""

    def __init__(self, namespace: str, *, require: bool = False, ledger_lock: AbstractContextManager[Any] | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.namespace = namespace
        self.require = require
        """Refuse nodes that have no agent Lease at all (``--require-agent-lease``)."""
        self.monotonic = monotonic
        self.wall = wall
        self.synced = False
        self._ledger_lock = ledger_lock or contextlib.nullcontext()
        """The ledger's lock (re-entrant): :meth:`refusals` reads the ledger's node names under it."""
        self._lock = threading.Lock()
        self._beats: dict[str, _Beat] = {}
        self._deadlines: list[tuple[float, str, str]] = []  # (deadline, node, renew_time), lazily pruned
        self._lapsed: set[str] = set()
        self._leased_version = 0  # moves when a node gains or loses its Lease
        self._unleased: tuple[tuple[int, int, int], frozenset[str]] = ((-1, -1, -1), frozenset())

    # ------------------------------------------------------------------------------ feeding
    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        """A full list of the agent Leases (the watch's list or re-list)."""
        with self._lock:
            seen: set[str] = set()
            for lease in items:
                node = self._apply(lease)
                if node:
                    seen.add(node)
            for node in set(self._beats) - seen:
                self._forget(node)
            self.synced = True

    def apply(self, kind: str, lease: dict[str, Any]) -> None:
        """One watch event."""
        with self._lock:
            if kind == "DELETED":
                node = lease_node(lease)
                if node and node in self._beats:
                    self._forget(node)
            else:
                self._apply(lease)

    def _forget(self, node: str) -> None:
        del self._beats[node]
        self._lapsed.discard(node)
        self._leased_version += 1

    def _apply(self, lease: dict[str, Any]) -> str:
        node = lease_node(lease)
        spec = lease.get("spec") or {}
        renew = str(spec.get("renewTime") or "")
        duration = spec.get("leaseDurationSeconds")
        if not node or not renew or not isinstance(duration, int) or isinstance(duration, bool) or duration < 1:
            log.warning("ignoring agent lease %s: no holderIdentity, renewTime or leaseDurationSeconds",
                        (lease.get("metadata") or {}).get("name"))
            return ""
        old = self._beats.get(node)
        if old is not None and old.renew_time == renew and old.duration_s == duration:
            return node  # the same renewal again (a re-list)
        now = self.monotonic()
        observed = now if old is not None else now - self._age(renew)
        self._beats[node] = _Beat(renew, observed, float(duration))
        if old is None:
            self._leased_version += 1
        self._lapsed.discard(node)
        heapq.heappush(self._deadlines, (observed + duration, node, renew))
        return node

    def _age(self, renew: str) -> float:
        """How long ago the Lease says it was renewed, by our wall clock (see :func:`renewed_ago`)."""
        return renewed_ago(renew, self.wall())

    # ------------------------------------------------------------------------------ reading
    def refusals(self, state: ClusterState) -> Mapping[str, str]:
        """Why GPU pods may not go to a node, for each node refused now (usually none)."""
        if not self.synced:
            return NO_REFUSALS  # the watch has not listed yet (or may not): fail open, as before
        with self._ledger_lock, self._lock:  # this order only: filter calls in holding the ledger lock
            now = self.monotonic()
            while self._deadlines and self._deadlines[0][0] <= now:
                _, node, renew = heapq.heappop(self._deadlines)
                beat = self._beats.get(node)
                if beat is not None and beat.renew_time == renew:
                    self._lapsed.add(node)
                    log.warning("node agent on %s stopped renewing its lease: GPU pods no longer go there", node)
            refused = {node: self._lapse_reason(node, now) for node in self._lapsed}
            if self.require:
                for node in self._nodes_without_lease(state):
                    refused[node] = self._missing_reason(node)
        return refused or NO_REFUSALS

    def _lapse_reason(self, node: str, now: float) -> str:
        beat = self._beats[node]
        return lapsed_reason(node, now - beat.observed_at, beat.duration_s)

    def _missing_reason(self, node: str) -> str:
        return missing_reason(node, self.namespace)

    def _nodes_without_lease(self, state: ClusterState) -> frozenset[str]:
        """Ledger nodes with no agent Lease, recomputed only when the ledger's nodes or the set of
        leased nodes changed (the usual call finds both the same)."""
        key = (id(state), state.layout_version, self._leased_version)
        if self._unleased[0] != key:
            self._unleased = (key, frozenset(n for n, row in state.index.items()
                                             if state.present[row] and n not in self._beats))
        return self._unleased[1]
