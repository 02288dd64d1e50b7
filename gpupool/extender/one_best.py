"""One node among the policy's best, for the filter's answer (``--filter-one-best``, the default).

Why: the best nodes are often many exact ties (every empty node, every node whose fullest card the
pod would fill alike: a median of 994 of 1,000 in ``bench/e2e_scheduling.py``). Passed them all,
kube-scheduler runs its score plugins on each and draws among its own favourites (LeastAllocated
prefers the emptiest: the opposite of packing). Passed one, kube-scheduler v1.20 takes it without
scoring (``genericScheduler.Schedule`` returns at once for a single feasible node), and the pod
lands where the simulator, breaking ties by the same kind of fixed node order, would put it.

The order is a hash of the node's name: the same for every call, every replica and every restart,
and unrelated to names' alphabetical order. A pod with soft preferences (preferred node or pod
affinity or anti-affinity, topology spread constraints that only prefer) still gets every best node,
so that kube-scheduler's plugins honour those preferences among them.

kube-scheduler filters the next pod while the last one's bind is still on its way, so the ledger
does not show that pod yet: a fixed order would hand the next pod the same node, and the second
bind would fail where the node has no room for both (and the pod wait out kube-scheduler's back-off).
So a node passed alone stays *in flight* until the ledger books its pod (the bind's reservation) or
the bind returns (or :data:`IN_FLIGHT_S` passed), and the order skips in-flight nodes while another
best node remains: what kube-scheduler's plugins did with the pods it had assumed. Where the only
best node is in flight, the HTTP adapter waits (:data:`IN_FLIGHT_WAIT_S` at most) for that pod's
booking and asks again, since the node may have no room for both.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gpupool.core.state import ClusterState, IntArray

RANK_BYTES = 7
"""Bytes of the name's digest in a rank: fits an int64 with room, ties between names ~never."""
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
IN_FLIGHT_S = 2.0
"""How long a node passed alone counts as in flight when its pod's bind never comes (a pod deleted
or refused by a later plugin); a bind normally comes within milliseconds."""
IN_FLIGHT_WAIT_S = 0.25
"""How long a filter whose only best node is in flight waits for that node's pod to be booked."""
IN_FLIGHT_POLL_S = 0.001
TIED_NOT_FIRST = "fits as well as the node passed, which comes first in gpupool's node order"
"""The reason of a best node that was not passed (sent only when no node passed, i.e. never)."""


def stable_rank(name: str) -> int:
    """The tie rank of a node: lower wins."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=RANK_BYTES).digest(), "big")


class TieRanks:
    """Each ledger row's rank, rebuilt only when the ledger's layout changes."""

    def __init__(self, rank_of: Callable[[str], int] = stable_rank) -> None:
        self._rank_of = rank_of
        self._by_name: dict[str, int] = {}
        self._rows: tuple[ClusterState, int, IntArray] | None = None

    def ranks(self, state: ClusterState) -> IntArray:
        """Rank per row of ``state`` (indexable by any row the state has)."""
        cached = self._rows
        if cached is not None and cached[0] is state and cached[1] == state.layout_version:
            return cached[2]
        by_name = self._by_name
        for spec in state.specs:
            if spec.name not in by_name:
                by_name[spec.name] = self._rank_of(spec.name)
        ranks = np.fromiter((by_name[spec.name] for spec in state.specs), dtype=np.int64, count=len(state.specs))
        self._rows = (state, state.layout_version, ranks)
        return ranks

    def first(self, state: ClusterState, rows: IntArray, skip: IntArray | None = None) -> int:
        """The position in ``rows`` of the row ranked first, rows in ``skip`` last."""
        ranks = self.ranks(state).take(rows)
        if skip is not None and len(skip):
            away = np.isin(rows, skip)
            if not away.all():
                ranks = np.where(away, np.iinfo(np.int64).max, ranks)
        return int(ranks.argmin())


class InFlight:
    """Nodes passed alone to pods whose bind has not booked them yet (thread-safe: filters run on
    the event loop, binds on a pool)."""

    def __init__(self, hold_s: float = IN_FLIGHT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._hold_s = hold_s
        self._clock = clock
        self._lock = threading.Lock()
        self._by_pod: dict[str, tuple[str, float]] = {}

    def passed(self, pod: str, node: str) -> None:
        """``node`` was passed alone to ``pod`` (``namespace/name``); a later filter of it replaces this."""
        with self._lock:
            self._by_pod[pod] = (node, self._clock() + self._hold_s)

    def booked(self, pod: str) -> None:
        """``pod``'s bind is over (booked or refused): its node is the ledger's business again."""
        with self._lock:
            self._by_pod.pop(pod, None)

    def _live(self, state: ClusterState) -> list[tuple[str, int]]:
        """Each pod in flight now with its node's ledger row. A pod the ledger already books (its
        bind reserved) is not in flight; entries held too long are dropped."""
        now = self._clock()
        with self._lock:
            if not self._by_pod:
                return []
            expired = [pod for pod, (_, until) in self._by_pod.items() if until <= now]
            for pod in expired:
                del self._by_pod[pod]
            entries = list(self._by_pod.items())
        booked = state.placements
        return [(pod, state.index[node]) for pod, (node, _) in entries if pod not in booked and node in state.index]

    def holders(self, state: ClusterState, but: str = "") -> dict[int, str]:
        """The ledger rows of the nodes in flight now for pods other than ``but``, each with one of
        those pods (a node passed to two pods stays in flight for the other when one asks again)."""
        return {row: pod for pod, row in self._live(state) if pod != but}

    def holds(self, pod: str, state: ClusterState) -> bool:
        """Whether ``pod``'s node is still in flight (whoever else holds that node too)."""
        return any(holder == pod for holder, _ in self._live(state))


class OneBest:
    """The fixed node order and the nodes in flight: which of the best nodes a filter passes."""

    def __init__(self, rank_of: Callable[[str], int] = stable_rank) -> None:
        self.ranks = TieRanks(rank_of)
        self.in_flight = InFlight()

    def choose(self, state: ClusterState, rows: IntArray, pod: str) -> tuple[int, str]:
        """The position in ``rows`` (the best nodes) of the one to pass to ``pod``: the first in the
        order among those not in flight for another pod, else the first; and the pod whose
        in-flight node it is ("" when none)."""
        holders = self.in_flight.holders(state, but=pod)
        skip = np.fromiter(holders, dtype=np.int64, count=len(holders)) if holders else None
        first = self.ranks.first(state, rows, skip) if len(rows) > 1 else 0
        return first, holders.get(int(rows[first]), "")


def has_soft_preferences(pod: Mapping[str, Any] | None) -> bool:
    """Whether kube-scheduler's score plugins would weigh a preference of ``pod`` (the object
    kube-scheduler sent): preferred node affinity, preferred pod affinity or anti-affinity, or a
    topology spread constraint with ``whenUnsatisfiable: ScheduleAnyway``. Malformed parts count as
    no preference (kube-scheduler's validation would have refused them)."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        return False
    affinity = spec.get("affinity")
    if isinstance(affinity, Mapping):
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
            rules = affinity.get(kind)
            if isinstance(rules, Mapping) and rules.get(PREFERRED):
                return True
    spread = spec.get("topologySpreadConstraints")
    return isinstance(spread, list) and any(
        isinstance(c, Mapping) and c.get("whenUnsatisfiable") == "ScheduleAnyway" for c in spread)
