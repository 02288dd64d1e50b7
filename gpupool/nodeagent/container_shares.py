"""What each container of this node's pods was granted, card by card, whichever path granted it.

A container gets its share either from its pod's ``assignment-v1`` (the device plugin's Allocate)
or from the DRA claims it uses (the driver's prepare). The readers that judge or show a container
against its grant (the risk checks, the usage monitor's per-container rows and series) must agree
on what that grant is, so they all read it here: one resolution of a container's claims
(``ContainerView.claims``, already resolved through the pod's ``resourceClaims`` and
``status.resourceClaimStatuses``) to the prepared claims' shares.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.core.model import CardSlice
from gpupool.nodeagent.types import PodView

ContainerName = tuple[str, str, str]
"""(namespace, pod, container)."""

ClaimKey = tuple[str, str]
"""(namespace, claim name)."""


def claim_shares(claims: Iterable[PodView]) -> dict[ClaimKey, tuple[CardSlice, ...]]:
    """(namespace, claim) → its slices on this node's cards, in the order its grant lists them, from
    the prepared claims' views (:meth:`gpupool.nodeagent.dra.claim_state.ClaimState.as_pods`: one
    container named after the claim). The one reading of those views: the grants here and the
    lending side's bookings (:mod:`gpupool.nodeagent.lending.claims`) both start from it."""
    shares: dict[ClaimKey, tuple[CardSlice, ...]] = {}
    for claim in claims:
        if claim.assignment is not None:
            for assignment in claim.assignment.placement.containers:
                shares[(claim.namespace, assignment.container)] = assignment.slices
    return shares


def grants_of(node: str, pods: Iterable[PodView], claims: Iterable[PodView] = ()) -> dict[ContainerName,
                                                                                       dict[int, CardSlice]]:
    """What each container of the running pods placed on this node holds, per card: its
    assignment's slices, and the shares of the prepared DRA ``claims`` it uses (as
    :meth:`gpupool.nodeagent.dra.claim_state.ClaimState.as_pods` views them, one container named
    after the claim). A container using two claims on one card holds their sum there."""
    by_claim = claim_shares(claims)
    grants: dict[ContainerName, dict[int, CardSlice]] = {}
    for pod in pods:
        if pod.terminated:
            continue
        if pod.assignment is not None and pod.assignment.placement.node in ("", node):
            for assignment in pod.assignment.placement.containers:
                slices = grants.setdefault((pod.namespace, pod.name, assignment.container), {})
                for piece in assignment.slices:
                    slices[piece.card] = piece
        for container in pod.containers:
            for claim_name in container.claims:
                held = grants.setdefault((pod.namespace, pod.name, container.name), {})
                for piece in by_claim.get((pod.namespace, claim_name), ()):
                    held[piece.card] = _sum(held[piece.card], piece) if piece.card in held else piece
    return grants


def claims_on_cards(pods: Iterable[PodView], claims: Iterable[PodView]) -> dict[tuple[str, str, str, int],
                                                                             tuple[str, ...]]:
    """(namespace, pod, container, card) → the prepared claims (names, in the pod's namespace) whose
    shares the container holds on that card, for the running ``pods``' containers using any: where
    a row of :func:`grants_of` came from."""
    by_claim = claim_shares(claims)
    used: dict[tuple[str, str, str, int], tuple[str, ...]] = {}
    for pod in pods:
        if pod.terminated:
            continue
        for container in pod.containers:
            for claim_name in container.claims:
                for card in dict.fromkeys(s.card for s in by_claim.get((pod.namespace, claim_name), ())):
                    key = (pod.namespace, pod.name, container.name, card)
                    used[key] = (*used.get(key, ()), claim_name)
    return used


def _sum(a: CardSlice, b: CardSlice) -> CardSlice:
    return CardSlice(a.card, a.memory_mib + b.memory_mib, a.compute + b.compute, exclusive=a.exclusive or b.exclusive)
