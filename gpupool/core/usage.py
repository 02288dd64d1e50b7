"""What each tenant holds, per GPU model, counted from the ledger's own bookings.

Why from the ledger: a quota is "limit minus what is allocated", and the only allocation that is
true at the moment of a decision is the ledger's (reservations of binds in flight included). A
counter patched on an object lags and can be lost; this tally is changed by the very calls that
book and release (:meth:`ClusterState.apply`, ``claim``, ``release``, a node's re-derivation), so
a quota checked and a placement booked under one lock see the same numbers.

A tenant is the namespace of the pod key (``namespace/name``); keys without a ``/`` (trace pods)
belong to the tenant "".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpupool.core.model import NodeSpec, Placement

UNKNOWN_MODEL = "unknown"
"""The model a booking is counted under when its card is not in the node's description."""


@dataclass(frozen=True)
class Amounts:
    """GPU resources in the quota's dimensions: memory (MiB), compute (per-mille of a card, whole
    cards included) and whole cards held exclusively."""

    memory_mib: int = 0
    compute: int = 0
    cards: int = 0

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(self.memory_mib + other.memory_mib, self.compute + other.compute,
                       self.cards + other.cards)

    def __sub__(self, other: Amounts) -> Amounts:
        return Amounts(self.memory_mib - other.memory_mib, self.compute - other.compute,
                       self.cards - other.cards)

    @property
    def zero(self) -> bool:
        return not (self.memory_mib or self.compute or self.cards)


NOTHING = Amounts()
ModelUse = Mapping[str, Amounts]
"""Amounts per GPU model."""


def total(use: ModelUse) -> Amounts:
    """The amounts of every model together."""
    summed = NOTHING
    for amounts in use.values():
        summed = summed + amounts
    return summed


def tenant_of(pod_key: str) -> str:
    """The tenant of a pod key: its namespace ("" for keys without one)."""
    namespace, slash, _ = pod_key.partition("/")
    return namespace if slash else ""


def placement_use(placement: Placement, spec: NodeSpec) -> dict[str, Amounts]:
    """What ``placement`` holds on ``spec``'s cards, per model of the card (init containers counted
    as the ledger counts them: the larger of them and the app containers, per card)."""
    use: dict[str, Amounts] = {}
    for card, (memory, compute, exclusive) in placement.held_per_card().items():
        model = spec.cards[card].model if 0 <= card < len(spec.cards) else UNKNOWN_MODEL
        use[model] = use.get(model, NOTHING) + Amounts(memory, compute, 1 if exclusive else 0)
    return use


class UsageTally:
    """Per tenant and model, the sum of what its booked placements hold."""

    def __init__(self) -> None:
        self._by_tenant: dict[str, dict[str, Amounts]] = {}
        self._held: dict[str, dict[str, Amounts]] = {}

    def add(self, key: str, use: dict[str, Amounts]) -> None:
        """Count ``use`` for pod ``key`` (replacing what it was counted with before)."""
        self.remove(key)
        self._held[key] = use
        tenant = self._by_tenant.setdefault(tenant_of(key), {})
        for model, amounts in use.items():
            tenant[model] = tenant.get(model, NOTHING) + amounts

    def remove(self, key: str) -> None:
        """Stop counting pod ``key`` (nothing when it is not counted)."""
        use = self._held.pop(key, None)
        if use is None:
            return
        tenant = self._by_tenant[tenant_of(key)]
        for model, amounts in use.items():
            left = tenant[model] - amounts
            if left.zero:
                del tenant[model]
            else:
                tenant[model] = left

    def of(self, tenant: str) -> ModelUse:
        """What ``tenant`` holds per model now (a copy: the tally moves on with the ledger)."""
        return dict(self._by_tenant.get(tenant, {}))
