"""Which pods of a node to evict so that a higher-priority GPU pod fits: the preempt verb's choice.

Why the extender chooses victims itself: gpupool's resources are ``ignoredByScheduler``, so when
kube-scheduler (v1.20 ``selectVictimsOnNode``) removes the lower-priority pods of a node and then
reprieves them one by one, its own filters pass with every pod back and it proposes the node with
*no* victims (or only the ones its CPU and memory need). Only the ledger knows which cards a pod
holds, so the preempt answer adds the GPU victims; kube-scheduler accepts any pod of the node in
the answer (it looks the uids up on the node) and deletes exactly those.

The choice: the proposed victims always stay (kube-scheduler's own filters need them); among the
node's other pods of lower priority than the preemptor, borrowers (pods placed on lent capacity,
low priority by definition) are taken first, then the lowest priorities. Several orders are tried,
one per card of the node (its holders first), and after each greedy pass every added victim that
is not needed is reprieved, so victims on cards the pod does not need stay. Of the sets found, the
one with the fewest non-borrowers, then the lowest highest priority, then the fewest pods wins
(kube-scheduler then ranks the nodes the same way).

DRA claims (issue 24): a pod holding gpupool's cards through ResourceClaims is a victim like any
other pod of its priority. Its claims are booked in the ledger under their own keys
(:mod:`gpupool.extender.dra_bookings`), so evicting the pod frees a claim's share only when every
pod the claim is reserved for is a victim too (the resourceclaim controller deallocates a claim
once nothing reserves it); the share freed is what the claim's allocation holds. A claim pod's
holder counts its claims' cards, so the per-card orders find it.

A claim pod as the preemptor (issue 24): its pending claims' asks are GPU containers of its request
(:mod:`gpupool.extender.claim_pods`, the reading filter uses), chosen for like an extended-resource
pod's; its allocated claims are ``kept`` bookings that must fit again on the cards the allocator
chose (:func:`fits_on`), so the victims free those cards.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from gpupool.core.model import Placement, PodRequest
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import AllocationError, ClusterState
from gpupool.core.what_if import what_if_copy

Fits = Callable[[frozenset[str]], bool]
"""Whether the preemptor fits on the node once the pods of these keys are gone."""

Refusal = Callable[[Placement], "str | None"]
"""Why the preemptor may not take this placement (its quotas, as its bind checks them), or None."""


@dataclass(frozen=True)
class Holder:
    """A pod bound to a node, as the preempt choice sees it."""

    key: str
    uid: str
    priority: int
    borrowed: bool = False
    cards: tuple[int, ...] = ()
    """The card positions its placement holds (empty for a pod without GPUs)."""


@dataclass(frozen=True)
class HeldClaim:
    """A DRA claim booked on a node, as the preempt choice sees it."""

    key: str
    users: tuple[str, ...]
    """The UIDs of the consumers it is reserved for: its share is freed only when all of them are
    victims (none: nobody to evict, never freed)."""
    cards: tuple[int, ...] = ()
    """The card positions its allocation holds (empty for one whose allocation cannot be read)."""


def freed_claims(claims: Sequence[HeldClaim], holders: Sequence[Holder], victims: Collection[str]) -> frozenset[str]:
    """The keys of the claims whose every user is a holder among ``victims`` (keys)."""
    key_of = {h.uid: h.key for h in holders if h.uid}
    return frozenset(c.key for c in claims
                     if c.users and all(key_of.get(user) in victims for user in c.users))


def freeing_claims(fits: Fits, claims: Sequence[HeldClaim], holders: Sequence[Holder]) -> Fits:
    """``fits`` asked with the claims each set of victims frees taken out too."""
    def asked(without: frozenset[str]) -> bool:
        return fits(without | freed_claims(claims, holders, without))
    return asked


def with_claim_cards(holders: Sequence[Holder], claims: Sequence[HeldClaim]) -> list[Holder]:
    """``holders`` with the cards of the claims reserved for them added to their own."""
    extra: dict[str, set[int]] = {}
    for claim in claims:
        for user in claim.users:
            extra.setdefault(user, set()).update(claim.cards)
    return [replace(h, cards=tuple(sorted({*h.cards, *extra[h.uid]}))) if extra.get(h.uid) else h for h in holders]


def fits_on(state: ClusterState, node: str, request: PodRequest,
            scheduler: Callable[[ClusterState], Scheduler], refusal: Refusal | None = None,
            kept: Sequence[Placement] = ()) -> Fits:
    """A :data:`Fits` asking a what-if copy of ``node`` (the shared ledger is only read; keys
    booked on other nodes change nothing here). ``scheduler``: builds the scheduler for a copy
    (the ledger's policy and workload profile); ``refusal``: the bind's quota check of the placement
    found (:meth:`gpupool.kube.tenancy_layers.Admission.quota_check`), so that no pod is evicted for a
    placement the preemptor's bind would refuse.

    ``kept``: the bookings of the preemptor's own allocated DRA claims. The allocator chose their
    cards, so they must fit exactly there: each is lifted from the copy and booked again by the
    card rule (a claim booked over capacity does not fit until victims free its card), before the
    rest of the request (its pending claims' asks, its extended resources), if any, is placed."""
    own = frozenset(p.pod_key for p in kept)

    def fits(without: frozenset[str]) -> bool:
        copy = what_if_copy(state, [node], without=without | own)
        try:
            for booking in kept:
                copy.apply(booking)
        except AllocationError:
            return False
        if not request.wants_gpu:
            return True
        placement = scheduler(copy).assign(request, node)
        return isinstance(placement, Placement) and (refusal is None or refusal(placement) is None)
    return fits


def _rank(chosen: frozenset[str], by_key: dict[str, Holder]) -> tuple[int, int, int, int]:
    """Fewest non-borrowers, lowest highest priority, fewest pods, lowest priority sum (unknown
    keys, kube-scheduler's own proposals, count as they are: they are in every set alike)."""
    known = [by_key[k] for k in chosen if k in by_key]
    return (sum(not h.borrowed for h in known), max((h.priority for h in known), default=-(1 << 31)),
            len(chosen), sum(h.priority for h in known))


def _greedy(order: Sequence[Holder], base: frozenset[str], fits: Fits) -> frozenset[str] | None:
    """Add victims in ``order`` until the pod fits, then reprieve every added one not needed
    (most important first); None when even all of them do not free enough."""
    chosen = set(base)
    added: list[Holder] = []
    for holder in order:
        if fits(frozenset(chosen)):
            break
        chosen.add(holder.key)
        added.append(holder)
    if not fits(frozenset(chosen)):
        return None
    for holder in sorted(added, key=lambda h: (h.borrowed, -h.priority, h.key)):
        trial = frozenset(chosen - {holder.key})
        if fits(trial):
            chosen.discard(holder.key)
    return frozenset(chosen)


def choose_victims(request: PodRequest, proposed: Collection[str], holders: Sequence[Holder],
                   fits: Fits, claims: Sequence[HeldClaim] = ()) -> frozenset[str] | None:
    """The keys to evict on one node (``proposed`` plus the fewest others), or None when no set of
    lower-priority pods frees enough there. ``claims``: the DRA claims booked on the node; ``fits``
    is asked with the keys of the claims a set of victims frees added (:func:`freed_claims`)."""
    if claims:
        holders = with_claim_cards(holders, claims)
        fits = freeing_claims(fits, claims, holders)
    base = frozenset(proposed)
    pool = [h for h in holders if h.key not in base and h.priority < request.priority]
    by_key = {h.key: h for h in pool}
    plain = sorted(pool, key=lambda h: (not h.borrowed, h.priority, h.key))
    orders = [plain]
    for card in sorted({c for h in pool for c in h.cards}):
        orders.append(sorted(pool, key=lambda h: (card not in h.cards, not h.borrowed, h.priority, h.key)))
    found = [s for s in (_greedy(order, base, fits) for order in orders) if s is not None]
    if not found:
        return None
    return min(found, key=lambda s: (_rank(s, by_key), sorted(s)))
