"""A claim pod's request for gpupool's node choice: its pending ResourceClaims' asks of gpupool's
cards as GPU containers of its :class:`PodRequest` (issue 24, docs/dra.md "Choosing between the
extender path and the DRA path").

Why: on the DRA path kube-scheduler's default scores choose a claim pod's node, spreading by CPU
and memory, which strands nearly twice the GPU the extender's node choice does (measured with
``gpupool simulate``; the allocator's first-fit card costs almost nothing). With the pod's claims
read as GPU containers, the filter scores the nodes kube-scheduler passed (its DRA filter ran
first) with the same core code as an extended-resource pod and passes the best one; the allocator
then picks the card there.

What is added: every claim of the pod that the claim watch has seen and that is not allocated
yet, for each request of gpupool's class (:func:`gpupool.kube.claim_asks.claim_ask`). An allocated
claim adds nothing (its allocation is booked in the ledger, and the DRA filter holds its pod to
that node). A claim the extender cannot model leaves the pod without gpupool's choice (its request
unchanged, the reason logged once per claim); a claim not seen yet is a :class:`TranslationError`,
answered as the filter's error so kube-scheduler retries the pod shortly.

A request with CEL selectors the extender reads (:mod:`gpupool.kube.device_selector`) places its
GPU container only on the cards they allow (:mod:`gpupool.extender.claim_selectors`): the node's
best card by gpupool is then one the allocator may choose. Selectors it cannot evaluate on the
ledger's cards leave the pod as a claim that cannot be modelled. A request's selection includes
its DeviceClass's own selectors (:mod:`gpupool.kube.device_classes`).

Preempt reads a claim pod the same way (:meth:`ClaimPodRequests.read`): its pending claims' asks
are placed as GPU containers, exactly as filter places them, and its allocated claims are named so
that the victims free the cards their allocations hold (:mod:`gpupool.extender.preemption`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpupool.core.card_scope import CardScope, narrow
from gpupool.core.model import ContainerRequest, GpuRequest, PodRequest
from gpupool.extender.claim_selectors import SelectedCards
from gpupool.extender.dra_bookings import ClaimBookings
from gpupool.kube.claim_asks import pod_claim_names
from gpupool.kube.claim_holding import claim_key
from gpupool.kube.translate import TranslationError

log = logging.getLogger(__name__)

TOLD_KEPT = 4096
"""Reasons already logged (claim and reason), forgotten all at once past this many."""
CLAIM_CONTAINER = "claim:"
"""Prefix of the containers a claim's requests become (``claim:<claim>/<request>``): never a
container's name, which cannot hold ``:``."""


@dataclass(frozen=True)
class ClaimPodReading:
    """A pod's request as gpupool places it, and the keys of its claims that are allocated already
    (booked in the ledger under those keys): what a preempt for the pod must make room for."""

    request: PodRequest
    allocated: tuple[str, ...] = ()


class ClaimPodRequests:
    """Adds a pod's pending claims' asks to its request, from the claim watch's store."""

    def __init__(self, claims: ClaimBookings, lock: threading.RLock) -> None:
        self.claims = claims
        self.lock = lock
        self.selected = SelectedCards(claims.state, claims.driver)
        self._told: set[str] = set()

    def _unmodelled(self, base: PodRequest, key: str, why: str) -> ClaimPodReading:
        """``base`` unchanged: the pod gets no node choice by gpupool; ``why`` logged once per claim."""
        told = f"{key}\0{why}"
        if told not in self._told:
            if len(self._told) >= TOLD_KEPT:
                self._told.clear()
            self._told.add(told)
            log.info("pod %s: no node choice by gpupool: %s", base.key, why)
        return ClaimPodReading(base)

    def request(self, pod: Mapping[str, Any], base: PodRequest) -> PodRequest:
        """``base`` (the pod's translated request) with one GPU container per gpupool request of
        each pending claim of the pod; ``base`` itself when it has none or one cannot be modelled."""
        return self.read(pod, base).request

    def read(self, pod: Mapping[str, Any], base: PodRequest) -> ClaimPodReading:
        """:meth:`request`, and the keys of the pod's allocated claims (none when a claim cannot be
        modelled: then the pod gets neither gpupool's node choice nor its GPU victims)."""
        named = pod_claim_names(pod)
        if not named:
            return ClaimPodReading(base)
        meta = pod.get("metadata")
        namespace = str(meta.get("namespace") or "") if isinstance(meta, Mapping) else ""
        added: list[ContainerRequest] = []
        allocated: list[str] = []
        with self.lock:
            if not self.claims.synced:
                raise TranslationError(f"pod {base.key}: the extender has not listed ResourceClaims yet; retry")
            if not self.claims.classes_synced:
                raise TranslationError(f"pod {base.key}: the extender has not listed DeviceClasses yet; retry")
            for in_pod, claim in named:
                key = claim_key(namespace, claim) if claim else ""
                ask = self.claims.asks.get(key) if claim else None
                if ask is None:
                    raise TranslationError(f"pod {base.key}: its claim {in_pod!r} "
                                           f"({claim or 'not made from its template yet'}) is not in the "
                                           "extender's cache yet; retry")
                if ask.allocated:
                    if key in self.claims.records:  # it holds gpupool's cards (not only other drivers')
                        allocated.append(key)
                    continue
                if ask.problem is not None:
                    return self._unmodelled(base, key, ask.problem)
                selections = dict(ask.selections)
                for name, gpu in ask.asks:
                    if name in selections:
                        scope = self.selected.scope(selections[name])
                        if isinstance(scope, str):
                            return self._unmodelled(base, key, f"claim {claim}, request {name[:64]!r}: {scope}")
                        gpu = _scoped(gpu, scope)
                    added.append(ContainerRequest(f"{CLAIM_CONTAINER}{claim}/{name}", gpu=gpu))
        request = replace(base, containers=(*base.containers, *added)) if added else base
        return ClaimPodReading(request, tuple(allocated))


def _scoped(gpu: GpuRequest, scope: CardScope) -> GpuRequest:
    return replace(gpu, scope=narrow(gpu.scope, scope))
