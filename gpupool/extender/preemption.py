"""The preempt verb over the ledger: per node kube-scheduler proposes, the victims whose eviction
frees the cards the pod needs, and what follows the answer.

Why apart from :mod:`gpupool.extender.service`: the choice of victims on one node is
:mod:`gpupool.extender.victims` (pure); this module asks it for every proposed node under the
ledger lock, with the pod's admission (group, quotas, card controls) and the nodes gated from
outside the ledger, and hands the answer to :class:`PreemptAnswers`, so that kube-scheduler's retry
of the pod is not left to chance (:mod:`gpupool.extender.requeue`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import PodRequest
from gpupool.core.policies import PlacementPolicy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from gpupool.extender.victims import HeldClaim, Holder, choose_victims, fits_on, freed_claims
from gpupool.kube.tenancy import PodTenancy
from gpupool.kube.tenancy_layers import Admissions

NodeGate = Callable[[ClusterState], Mapping[str, str]]
"""Per node, why it takes no pod, from outside the ledger (:mod:`gpupool.extender.liveness`)."""


class ClaimHolders(Protocol):
    """The DRA claims booked in the ledger (:class:`gpupool.extender.dra_bookings.ClaimBookings`)."""

    def held_on(self, node: str) -> list[HeldClaim]:
        """The claims booked on ``node`` (or unreadable there), with the pods they are reserved for."""


class PreemptLedger(Protocol):
    """What a preempt answer reads of the ledger (:class:`gpupool.extender.cache.ClusterCache`)."""

    lock: threading.RLock
    state: ClusterState
    admissions: Admissions
    profile: WorkloadProfile | None
    """The workload profile the ledger's scheduler was built with (what-if schedulers use it too)."""

    def new_policy(self) -> PlacementPolicy:
        """A fresh instance of the ledger's placement policy."""

    def key_for_uid(self, uid: str) -> str | None:
        """``namespace/name`` of a known pod by uid."""

    def holders_on(self, node: str) -> list[Holder]:
        """The pods booked on ``node``, with their priority and whether they borrow lent capacity."""

    def unreadable_on(self, node: str) -> frozenset[str]:
        """Pods bound to ``node`` whose assignment cannot be read (and claims whose allocation cannot)."""

    @property
    def claims(self) -> ClaimHolders:
        """The DRA claims in the ledger: a claim pod's victims free its claims' shares."""


class PreemptAnswers(Protocol):
    """What follows a preempt answer: kube-scheduler evicts the victims of one node, then retries
    the pod (:class:`gpupool.extender.requeue.PreemptRequeue` sees that it is retried)."""

    def remember(self, key: str, victims: Mapping[str, Collection[str]]) -> None:
        """The answer for pod ``key``: per node, the keys of its victims and of the DRA claims they
        free (called under the ledger lock)."""

    def awaiting(self, key: str) -> bool:
        """Whether pod ``key`` has a recent answer whose victims are still booked: kube-scheduler is
        evicting them, and a further answer would evict more pods for one pod."""


class NoFollowUp:
    """:class:`PreemptAnswers` that remembers nothing (a service without the API, tests)."""

    def remember(self, key: str, victims: Mapping[str, Collection[str]]) -> None:
        """Nothing to remember."""

    def awaiting(self, key: str) -> bool:
        """Never."""
        return False


def what_if_scheduler(ledger: PreemptLedger) -> Callable[[ClusterState], Scheduler]:
    """Builds the scheduler over a what-if copy as the ledger's own is built (policy, workload profile)."""
    def build(state: ClusterState) -> Scheduler:
        return Scheduler(state, ledger.new_policy(), profile=ledger.profile)
    return build


def answer_preemption(ledger: PreemptLedger, request: PodRequest, victims: Mapping[str, list[str]],
                      tenant: PodTenancy | None, gate: NodeGate, answers: PreemptAnswers,
                      own_claims: Collection[str] = ()) -> dict[str, list[str]]:
    """Per proposed node, the victims (uids) whose eviction frees the cards the pod needs; nodes
    where no set of lower-priority pods frees enough (within the pod's quotas) are left out, and
    so are nodes left with no victim at all: kube-scheduler before kubernetes#101560 indexes the
    first victim of every candidate and crashes on an empty list.

    kube-scheduler's proposals stay; the extender adds the GPU victims it needs, borrowers first
    (:mod:`gpupool.extender.victims`), claim pods among them: a DRA claim booked on the node is
    freed when every pod it is reserved for is a victim. Every question is asked of a what-if copy
    of the node (:func:`gpupool.core.what_if.what_if_copy`); the shared ledger is only read. A node
    holding a pod whose assignment cannot be read (or a claim whose allocation cannot) stays refused
    unless every such pod is a victim (every such claim freed). No node while the victims of the
    pod's last answer, and the claims they free, are still booked (``answers.awaiting``).

    A claim pod preempts too (:meth:`gpupool.extender.claim_pods.ClaimPodRequests.read`): its
    pending claims' asks are in ``request``; ``own_claims``, the keys of its claims allocated
    already, must fit again where the allocator booked them (:func:`fits_on`'s ``kept``), so only
    their node is answered, and no node when one of them is not booked (its allocation unreadable,
    its node unknown) or they lie on several nodes. They are never counted as freed: the pod keeps them.
    """
    kept: dict[str, list[str]] = {}
    named: dict[str, frozenset[str]] = {}
    with ledger.lock:
        admission = ledger.admissions.admit(ledger.state, request, tenant)  # its group's cards and controls
        if admission.error is not None:
            return {}
        request = admission.request
        if answers.awaiting(request.key):  # its victims are being evicted: no more
            return {}
        state = ledger.state
        own = [state.placements[key] for key in own_claims if key in state.placements]
        own_nodes = {p.node for p in own}
        if len(own) < len(own_claims) or len(own_nodes) > 1:  # unknown to make room for, or no one node
            return {}
        gated = gate(state)
        refusal = admission.quota_check(state)  # the bind's check: evict nobody for a refused bind
        for node, uids in victims.items():
            if node in gated or node not in state.index or (own_nodes and node not in own_nodes):
                continue
            proposed = {k for k in map(ledger.key_for_uid, uids) if k is not None}
            holders = ledger.holders_on(node)
            claims = [c for c in ledger.claims.held_on(node) if c.key not in own_claims]
            fits = fits_on(state, node, request, what_if_scheduler(ledger), refusal, own)
            chosen = choose_victims(request, proposed, holders, fits, claims)
            if chosen is None:
                continue
            freed = freed_claims(claims, holders, chosen)
            if ledger.unreadable_on(node) - chosen - freed:
                continue
            uid_of = {h.key: h.uid for h in holders}
            answer = list(uids) + [uid_of[k] for k in sorted(chosen - proposed) if k in uid_of]
            if answer:
                kept[node] = answer
                named[node] = chosen | freed  # the pod is retried once the claims are released too
        answers.remember(request.key, named)  # under the lock: no victim is released in between
    return kept
