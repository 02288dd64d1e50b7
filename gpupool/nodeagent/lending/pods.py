"""What the lending rules need to know about the node's pods, kept from the agent's pod watch.

The rules run on the event source's thread while an opener may be waiting, so they cannot ask the
API: this feed (one more :class:`~gpupool.nodeagent.pod_cache.PodFeed` of the agent's watch) keeps,
per pod, its priority reading, whether it is a borrower and of whom, which cards its own
assignment books per container, its checkpoint key and its containers' runtime IDs.

A container that uses a prepared DRA claim is booked on the claim's cards exactly as on its
assignment's (:mod:`gpupool.nodeagent.lending.claims`): claims are prepared and unprepared apart from
the pod's events, so the feed keeps the claim names each container uses and resolves them against
the prepared claims whenever a pod is read (:meth:`LendingPods.get`, :meth:`LendingPods.all`).

It reads them from the record the pod cache decoded once (:class:`~gpupool.nodeagent.node_pod.NodePod`),
never from the raw pod: what is left here is the lending rules' own reading of those values (the
priority against the threshold, the borrower mark and checkpoint key under the lending names).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpupool.api.lending import (
    DEFAULT_HIGH_PRIORITY_THRESHOLD,
    PROCESS_CHECKPOINT,
    LendingNames,
    Priority,
    is_borrowed,
    pod_priority,
)
from gpupool.core.model import CardSlice, ContainerAssignment
from gpupool.nodeagent.container_shares import claim_shares
from gpupool.nodeagent.lending.claims import ClaimShares, PreparedClaims, claim_cards, no_claims
from gpupool.nodeagent.node_pod import NodePod, PodKey
from gpupool.nodeagent.types import PodView

Region = tuple[str, tuple[int, ...]]
"""An interception-library region a container's use of cards is accounted in: its name under the pod's
UID (the container's, or for a DRA claim the claim's: the grant is the claim's) and the cards at its
CUDA ordinals, in order."""


@dataclass(frozen=True)
class LendingPod:
    """One pod as the lending side sees it."""

    namespace: str
    name: str
    uid: str
    priority: Priority
    borrowed: bool
    borrowed_from: str
    booked: Mapping[str, frozenset[int]]
    """Container → the card indices its assignment books, and those of the prepared claims it uses."""
    cards: Mapping[str, tuple[int, ...]]
    """Container → those cards: its assignment's in the order the container sees them (CUDA ordinal 0
    first), then its claims'."""
    checkpoint_key: str
    container_ids: Mapping[str, str]
    """Container → runtime container ID (``<runtime>://`` stripped; empty until created)."""
    claims: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Container → the ResourceClaims (in the pod's namespace) it uses, prepared or not."""
    regions: Mapping[str, tuple[Region, ...]] = field(default_factory=dict)
    """Container → the regions its cards are accounted in (its assignment's, then each prepared claim's)."""
    shares: Mapping[str, tuple[CardSlice, ...]] = field(default_factory=dict)
    """Container → the slices its assignment books that it may still open: an app container's, an init
    container's only while no app container was created, none once the pod ended
    (:func:`live_shares`). What a loan leaves out for an owner not holding the card
    (:mod:`gpupool.nodeagent.lending.bookings`)."""
    spec_priority: int = 0
    """The pod's ``spec.priority`` (0 when none). Every borrower is low at open (:attr:`priority`);
    this orders borrowers among themselves when some must go (:mod:`gpupool.nodeagent.lending.over_loan`)."""
    process_checkpoint: bool = False
    """The pod says ``checkpoint: process`` (:attr:`~gpupool.api.lending.LendingNames.checkpoint`): its
    containers run under ``criu-run``, so a reclaim signals each container's process 1 only."""

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.name)

    def region(self, container: str, card: int) -> tuple[str, int] | None:
        """The region ``container``'s use of ``card`` is accounted in: its name under the pod's UID
        and the card's CUDA ordinal there; ``None`` when the container has no share of the card."""
        for name, cards in self.regions.get(container, ()):
            if card in cards:
                return name, cards.index(card)
        return None

    def uses_claims(self) -> bool:
        return any(self.claims.values())


def with_claims(pod: LendingPod, shares: ClaimShares) -> LendingPod:
    """``pod`` with the cards of the prepared claims its containers use booked (a claim not prepared
    on this node books nothing)."""
    if not pod.uses_claims():
        return pod
    booked = dict(pod.booked)
    cards = dict(pod.cards)
    regions = dict(pod.regions)
    for container, names in pod.claims.items():
        for claim in names:
            mine = claim_cards(shares.get((pod.namespace, claim), ()))
            if not mine:
                continue
            booked[container] = booked.get(container, frozenset()) | frozenset(mine)
            cards[container] = tuple(dict.fromkeys((*cards.get(container, ()), *mine)))
            regions[container] = (*regions.get(container, ()), (claim, mine))
    return replace(pod, booked=booked, cards=cards, regions=regions)


def checkpoint_key(pod: NodePod, names: LendingNames) -> str:
    """The task a pod belongs to: its annotation, else its controller's UID, else namespace/name."""
    said = pod.annotations.get(names.checkpoint_key, "").strip()
    return said or pod.controller_uid or f"{pod.namespace}/{pod.name}"


def live_shares(containers: Iterable[ContainerAssignment], ids: Mapping[str, str],
                terminated: bool) -> dict[str, tuple[CardSlice, ...]]:
    """Container → its assignment's slices, for the containers that may still open their cards: none
    once the pod ended (phase Succeeded or Failed, or being deleted); an init container's only until
    an app container was created (init containers run first, one at a time, and never again)."""
    if terminated:
        return {}
    found = list(containers)
    apps_created = any(ids.get(c.container) for c in found if not c.init)
    return {c.container: c.slices for c in found if c.slices and not (c.init and apps_created)}


def lending_pod(pod: NodePod, names: LendingNames,
                threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD) -> LendingPod | None:
    """One pod as the lending side sees it; ``None`` when it has no UID."""
    ids = pod.containers
    if ids is None:
        return None
    cards: dict[str, tuple[int, ...]] = {}
    assigned = pod.assignment.placement.containers if pod.assignment is not None else ()
    cards = {c.container: tuple(s.card for s in c.slices) for c in assigned}
    container_ids = {k: v.partition("://")[2] or v for k, v in ids.containers.items()}
    terminated = isinstance(pod.view, PodView) and pod.view.terminated
    claims = ({c.name: c.claims for c in pod.view.containers if c.claims} if isinstance(pod.view, PodView)
              else {})
    annotations = pod.annotations
    return LendingPod(namespace=ids.namespace, name=ids.name, uid=ids.uid,
                      priority=pod_priority(pod.spec_priority, annotations, threshold=threshold, names=names,
                                            task_priority=pod.task_priority),
                      borrowed=is_borrowed(annotations, names),
                      borrowed_from=annotations.get(names.borrowed_from, ""),
                      booked={k: frozenset(v) for k, v in cards.items()}, cards=cards,
                      checkpoint_key=checkpoint_key(pod, names),
                      container_ids=container_ids, claims=claims, regions={k: ((k, v),) for k, v in cards.items()},
                      shares=live_shares(assigned, container_ids, terminated),
                      spec_priority=pod.spec_priority or 0,
                      process_checkpoint=annotations.get(names.checkpoint, "").strip() == PROCESS_CHECKPOINT)


class LendingPods:
    """The feed and its thread-safe lookups; pods come out with their prepared claims booked."""

    def __init__(self, names: LendingNames, threshold: int = DEFAULT_HIGH_PRIORITY_THRESHOLD,
                 prepared: PreparedClaims = no_claims) -> None:
        self._names = names
        self._threshold = threshold
        self._prepared = prepared
        self._lock = threading.Lock()
        self._pods: dict[PodKey, LendingPod] = {}
        self.synced = False
        """Whether a full list arrived (before it, a missing pod may merely be unknown yet)."""

    def on_list(self, items: Iterable[NodePod]) -> None:
        """A full list: exactly these pods."""
        pods = [p for p in (lending_pod(o, self._names, self._threshold) for o in items) if p]
        with self._lock:
            self._pods = {p.key: p for p in pods}
            self.synced = True

    def on_event(self, kind: str, obj: NodePod) -> None:
        """A watch event."""
        pod = lending_pod(obj, self._names, self._threshold)
        if pod is None:
            return
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(pod.key, None)
            else:
                self._pods[pod.key] = pod

    def use_claims(self, prepared: PreparedClaims) -> None:
        """Read the DRA driver's prepared claims from ``prepared`` (the agent runs with ``--dra``)."""
        self._prepared = prepared

    @property
    def prepared(self) -> PreparedClaims:
        """Where the prepared claims are read (:func:`~gpupool.nodeagent.lending.claims.no_claims`
        without ``--dra``)."""
        return self._prepared

    def claim_shares(self) -> ClaimShares:
        """The prepared claims now: (namespace, claim) → its slices on this node."""
        return claim_shares(self._prepared())

    def get(self, key: PodKey) -> LendingPod | None:
        """The pod, if the watch has it, with the prepared claims it uses."""
        with self._lock:
            pod = self._pods.get(key)
        return with_claims(pod, self.claim_shares()) if pod is not None and pod.uses_claims() else pod

    def all(self) -> list[LendingPod]:
        """Every pod the watch has now, with the prepared claims they use."""
        with self._lock:
            pods = list(self._pods.values())
        if not any(p.uses_claims() for p in pods):
            return pods
        shares = self.claim_shares()
        return [with_claims(p, shares) for p in pods]

    def borrowers_of(self, owner: str) -> list[LendingPod]:
        """Pods marked as borrowing from ``owner`` (``namespace/name``)."""
        with self._lock:
            return [p for p in self._pods.values() if p.borrowed and p.borrowed_from == owner]
