"""Where a pod could borrow: the core's own filter, scoring and card choice run on lent capacity.

Why a view and not a second rule set: what a borrower may take of a lent card is the card's loan
less what its borrowers hold (:mod:`gpupool.core.lent`). A private :class:`ClusterState` of the
lending nodes whose cards show exactly that as their free memory and compute (cards not lent show
less than nothing; every card shows as shared, so a whole-card request fits none) lets the
vectorised masks, the placement policy, the card choosers and the explanations run unchanged on
lent capacity. The node's CPU and memory are the ledger's: a borrower needs them like any pod.
The placement chosen on the view names the owner of its first card (``borrowed_from``) and is
booked in the real ledger, whose check (:meth:`ClusterState.check`) applies the lent rule again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from gpupool.core.fragmentation import FloatArray, WorkloadProfile
from gpupool.core.model import CardMode, Placement, PodRequest
from gpupool.core.policies import PlacementPolicy
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import ClusterState, IntArray

NOT_LENT_FREE = -1
"""Free memory and compute a card without a loan shows in the view: no slice fits it."""

NOTHING_LENT = "no card of this node is lent"


@dataclass(frozen=True)
class LentView:
    """A private ledger of lending nodes (``view``) and the real ledger row of each of its rows."""

    view: ClusterState
    real_rows: IntArray

    def real(self, view_rows: IntArray) -> IntArray:
        """The real rows of ``view_rows``."""
        found: IntArray = self.real_rows[view_rows]
        return found


@dataclass(frozen=True)
class LentFit:
    """The rows (real) whose loans can hold the pod, their policy scores, and reasons for the rest."""

    rows: IntArray
    scores: FloatArray
    reasons: dict[int, str]


def lent_view(state: ClusterState, rows: Iterable[int]) -> LentView:
    """The view of the present nodes among ``rows`` that lend at least one card."""
    lending = set(state.lent.lending_rows())
    real = [int(r) for r in dict.fromkeys(int(x) for x in rows) if int(r) in lending and state.present[int(r)]]
    view = ClusterState((state.specs[r] for r in real), max_cards=state.max_cards)
    for mine, row in enumerate(real):
        count = int(state.card_count[row])
        view.cpu_free[mine] = state.cpu_free[row]
        view.mem_free[mine] = state.mem_free[row]
        view.card_healthy[mine, :count] = state.card_healthy[row, :count]
        view.card_mode[mine, :count] = int(CardMode.SHARED)
        for card in range(count):
            loan = state.lent.loan(row, card)
            mib, milli = state.lent.free(row, card) if loan is not None else (NOT_LENT_FREE, NOT_LENT_FREE)
            view.card_mem_free[mine, card] = min(mib, int(state.card_mem_total[row, card]))
            view.card_compute_free[mine, card] = min(milli, int(state.card_compute_total[row, card]))
            view.card_holders[mine, card] = state.lent.borrowers(row, card)
    return LentView(view, np.array(real, dtype=np.int64))


def lent_fit(state: ClusterState, request: PodRequest, rows: Iterable[int], policy: PlacementPolicy,
             profile: WorkloadProfile | None = None, explain_limit: int = 64) -> LentFit:
    """Which of ``rows`` could hold ``request`` on lent capacity, scored by ``policy`` (a fresh
    instance: the view prepares it), with reasons for up to ``explain_limit`` of the others."""
    asked = [int(r) for r in rows]
    seen = lent_view(state, asked)
    reasons: dict[int, str] = {}
    lending = set(seen.real_rows.tolist())
    for row in asked[:explain_limit]:
        if row not in lending:
            reasons[row] = NOTHING_LENT
    if not len(seen.real_rows):
        return LentFit(np.zeros(0, dtype=np.int64), np.zeros(0), reasons)
    scheduler = Scheduler(seen.view, policy, profile=profile, cache=False)
    ok, scores = scheduler.filter_and_score(request)
    refused = np.setdiff1d(np.arange(seen.view.size, dtype=np.int64), ok)
    for name, why in scheduler.explain(request, refused[:explain_limit]).items():
        reasons[int(seen.real_rows[seen.view.index[name]])] = f"lent capacity: {why}"
    return LentFit(seen.real(ok), scores, reasons)


def lent_assign(state: ClusterState, request: PodRequest, node: str, policy: PlacementPolicy,
                profile: WorkloadProfile | None = None) -> Placement | Unschedulable:
    """The cards of ``node``'s loans the policy chooses for ``request`` (nothing is booked); the
    placement names the owner of its first card."""
    row = state.index.get(node)
    if row is None or not state.present[row]:
        return Unschedulable(request.key, f"node {node} is not known to gpupool")
    seen = lent_view(state, [row])
    if not len(seen.real_rows):
        return Unschedulable(request.key, NOTHING_LENT)
    decision = Scheduler(seen.view, policy, profile=profile, cache=False).assign(request, node)
    if isinstance(decision, Unschedulable):
        return Unschedulable(request.key, f"lent capacity: {decision.reason}")
    return with_owner(state, row, decision)


def with_owner(state: ClusterState, row: int, placement: Placement) -> Placement | Unschedulable:
    """``placement`` marked as borrowed from the owner of its first card (lowest position)."""
    cards = sorted(placement.held_per_card())
    loan = state.lent.loan(row, cards[0]) if cards else None
    if loan is None:
        return Unschedulable(placement.pod_key, "a borrower must hold at least one lent card")
    return dataclasses.replace(placement, borrowed_from=loan.owner)


PolicyFactory = Callable[[], PlacementPolicy]
"""Makes a fresh placement policy for one view (a view prepares the policy it is given)."""
