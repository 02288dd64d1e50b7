"""Owners booked on a card who are not its loan's owners, and the borrowers booked on it.

An extended-resource pod's assignment books its containers a share of a card whether or not they hold
it: a pod whose container has not started yet, or one the extender placed on the card after its loan
began (owners' bookings and borrowers' are two budgets: :mod:`gpupool.core.lent`), is booked there
without being one of the loan's owners. Nothing watches such a container and its allocations have no
wait bound, so the lending service never lends its share (:func:`gpupool.nodeagent.lending.loans.new_loans`
and :func:`~gpupool.nodeagent.lending.loans.keep_new_bookings`), gives it the owners' wait bound
while the card is lent or draining, and reclaims just enough of the borrowers of a loan that shrank
for it to bring the others within it (:mod:`gpupool.nodeagent.lending.over_loan`); the others and
such an owner do not conflict at open (:func:`left_out`). These are the helpers that read the pods for it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from gpupool.nodeagent.lending.pods import LendingPod
from gpupool.nodeagent.lending.rules import ContainerKey

BookingKey = tuple[str, str]
"""(pod UID, container): one container's booking. By UID, not name: a pod recreated under the same
name (a StatefulSet's) is a new booking, whose share may differ."""

Share = tuple[int, int, bool]
"""Memory MiB, compute per-mille, whether the whole card."""


def owner_bookings(card: int, pods: Iterable[LendingPod], owners: Collection[ContainerKey]) -> dict[BookingKey, Share]:
    """The share of ``card`` each container of a pod that does not borrow books, except ``owners``
    (the loan's: their share is lent while they idle, since they are watched)."""
    found: dict[BookingKey, Share] = {}
    for pod in pods:
        if pod.borrowed:
            continue
        for container, slices in pod.shares.items():
            mine = [piece for piece in slices if piece.card == card]
            if mine and (pod.namespace, pod.name, container) not in owners:
                found[(pod.uid, container)] = (sum(p.memory_mib for p in mine), sum(p.compute for p in mine),
                                               any(p.exclusive for p in mine))
    return found


def total(shares: Iterable[Share]) -> Share:
    """Several shares of one card together."""
    memory = compute = 0
    whole = False
    for mib, milli, exclusive in shares:
        memory, compute, whole = memory + mib, compute + milli, whole or exclusive
    return memory, compute, whole


def booked_containers(card: int, pods: Iterable[LendingPod]) -> frozenset[ContainerKey]:
    """Every container of a pod that does not borrow booked on ``card`` (its assignment's or a prepared
    claim's): the owners whose allocations wait for room while the card is lent or draining."""
    return frozenset((pod.namespace, pod.name, container) for pod in pods if not pod.borrowed
                     for container, cards in pod.booked.items() if card in cards)


def left_out(kept: Collection[BookingKey], pods: Iterable[LendingPod]) -> frozenset[ContainerKey]:
    """The containers of ``pods`` whose booking ``kept`` names (a loan's
    :attr:`~gpupool.nodeagent.lending.loans.Loan.kept_bookings`: their share is not lent)."""
    if not kept:
        return frozenset()
    return frozenset((pod.namespace, pod.name, container) for pod in pods
                     for container in {*pod.booked, *pod.shares} if (pod.uid, container) in kept)
