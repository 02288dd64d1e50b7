"""The DRA claims the agent prepared, as the lending side reads them: each claim's shares per card.

A container that uses a prepared claim (``resources.claims``) holds the claim's shares as a
container of an extended-resource pod holds its assignment's slices (docs/dra.md), so lending counts
them the same way (:mod:`gpupool.nodeagent.lending.pods`): the container is **booked** on the
claim's cards, an owner when it holds one idle, rule 1 when it opens a lent one. Read from the DRA
driver's prepared claims (``ClaimState.as_pods``: one pod-like view per claim, its one container
named after the claim), the same views risk detection grants containers from.

What a claim holds while no container using it holds the card is not lent at all
(:func:`unheld_on`): see :func:`gpupool.nodeagent.lending.loans.new_loans` for why.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from gpupool.core.model import CardSlice
from gpupool.nodeagent.container_shares import ClaimKey
from gpupool.nodeagent.types import PodView

ClaimShares = Mapping[ClaimKey, tuple[CardSlice, ...]]
"""Each prepared claim's slices on this node's cards (NVML index), in the order its grant lists them
(the CUDA ordinals of the claim's containers and of its interception-library region)."""

PreparedClaims = Callable[[], Iterable[PodView]]
"""The driver's prepared claims as pod-like views (``ClaimState.as_pods``)."""


def no_claims() -> tuple[PodView, ...]:
    """The source of a node agent without ``--dra``."""
    return ()


def claim_cards(slices: Iterable[CardSlice]) -> tuple[int, ...]:
    """The cards of a claim's slices, each once, in their order."""
    return tuple(dict.fromkeys(s.card for s in slices))


def unheld_on(card: int, shares: ClaimShares, held: Collection[ClaimKey]) -> frozenset[ClaimKey]:
    """The prepared claims with a share of ``card`` that are not in ``held`` (the claims some
    container holding the card, or owning its loan, uses)."""
    return frozenset(key for key, slices in shares.items()
                     if key not in held and any(piece.card == card for piece in slices))


def booked_on(card: int, shares: ClaimShares, keys: Iterable[ClaimKey]) -> tuple[int, int, bool]:
    """Memory MiB, compute per-mille and whether the whole card is booked on ``card`` by the claims
    ``keys`` together."""
    memory = compute = 0
    whole = False
    for key in keys:
        for piece in shares.get(key, ()):
            if piece.card == card:
                memory += piece.memory_mib
                compute += piece.compute
                whole = whole or piece.exclusive
    return memory, compute, whole
