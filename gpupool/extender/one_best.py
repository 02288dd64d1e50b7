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

kube-scheduler filters the next pod while the last one's bind is still on its way. The node passed
alone is not skipped for the next pod: the filter books its pod's cards there at once (``ASSUMED``,
:mod:`gpupool.extender.bookings`), so the next filter sees the node as fuller and passes it again
only where it holds the next pod too (a packing policy often prefers it then, as the simulator,
placing pods one after the other, would): kube-scheduler's own plugins likewise see the pods it has
assumed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gpupool.core.state import ClusterState, IntArray

RANK_BYTES = 7
"""Bytes of the name's digest in a rank: fits an int64 with room, ties between names ~never."""
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
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

    def first(self, state: ClusterState, rows: IntArray) -> int:
        """The position in ``rows`` of the row ranked first."""
        return int(self.ranks(state).take(rows).argmin())


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
