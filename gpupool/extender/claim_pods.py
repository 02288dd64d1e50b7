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
unchanged, the reason logged); a claim not seen yet is a :class:`TranslationError`, answered as the
filter's error so kube-scheduler retries the pod shortly.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpupool.core.model import ContainerRequest, PodRequest
from gpupool.extender.dra_bookings import ClaimBookings
from gpupool.kube.claim_asks import pod_claim_names
from gpupool.kube.claim_holding import claim_key
from gpupool.kube.translate import TranslationError

log = logging.getLogger(__name__)

CLAIM_CONTAINER = "claim:"
"""Prefix of the containers a claim's requests become (``claim:<claim>/<request>``): never a
container's name, which cannot hold ``:``."""


class ClaimPodRequests:
    """Adds a pod's pending claims' asks to its request, from the claim watch's store."""

    def __init__(self, claims: ClaimBookings, lock: threading.RLock) -> None:
        self.claims = claims
        self.lock = lock

    def request(self, pod: Mapping[str, Any], base: PodRequest) -> PodRequest:
        """``base`` (the pod's translated request) with one GPU container per gpupool request of
        each pending claim of the pod; ``base`` itself when it has none or one cannot be modelled."""
        named = pod_claim_names(pod)
        if not named:
            return base
        meta = pod.get("metadata")
        namespace = str(meta.get("namespace") or "") if isinstance(meta, Mapping) else ""
        added: list[ContainerRequest] = []
        with self.lock:
            if not self.claims.synced:
                raise TranslationError(f"pod {base.key}: the extender has not listed ResourceClaims yet; retry")
            for in_pod, claim in named:
                ask = self.claims.asks.get(claim_key(namespace, claim)) if claim else None
                if ask is None:
                    raise TranslationError(f"pod {base.key}: its claim {in_pod!r} "
                                           f"({claim or 'not made from its template yet'}) is not in the "
                                           "extender's cache yet; retry")
                if ask.allocated:
                    continue
                if ask.problem is not None:
                    log.info("pod %s: no node choice by gpupool: %s", base.key, ask.problem)
                    return base
                added.extend(ContainerRequest(f"{CLAIM_CONTAINER}{claim}/{name}", gpu=gpu) for name, gpu in ask.asks)
        if not added:
            return base
        return replace(base, containers=(*base.containers, *added))
