"""The claim-groups webhook's verdict: a new ResourceClaim gets selectors that keep kube-scheduler's
DRA allocator on the cards its resource groups allow (:mod:`gpupool.kube.claim_groups`, docs/dra.md
"Resource groups and claims").

Reads only the extender's caches under their lock (the tenancy book, the ledger's nodes and cards,
gpupool's device classes), so no request costs an API call. Unlike the quota webhook, which admits
what it cannot judge because the filter still enforces quotas later, nothing but this selector keeps
a claim inside its groups: a claim arriving before the extender has listed everything is refused
(the resourceclaim controller retries a template's claim; a user retries their own).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from gpupool.extender.admission import ALLOWED, Verdict
from gpupool.extender.ledger_reads import TenancyLedger
from gpupool.kube.claim_groups import ClaimGroupError, claim_cards, claim_patch, selector_expressions

log = logging.getLogger(__name__)

NOT_SYNCED = ("gpupool: the extender has not listed nodes and resource groups yet, so the claim cannot be "
              "kept to its resource groups' cards; retry in a moment")


class ClassSource(Protocol):
    """gpupool's device classes now and the driver their devices belong to
    (:class:`gpupool.extender.dra_bookings.ClaimBookings`)."""

    classes: frozenset[str]
    driver: str


class ClaimGroupAdmission:
    """Judges new ResourceClaims against the resource groups of a :class:`TenancyLedger`."""

    def __init__(self, ledger: TenancyLedger, claims: ClassSource) -> None:
        self.ledger = ledger
        self.claims = claims

    def review(self, claim: Mapping[str, Any], namespace: str) -> Verdict:
        """The verdict on creating ``claim`` in ``namespace``: allowed with a patch adding the
        groups' selectors, allowed untouched when nothing is to be kept out, refused with the reason."""
        labels = (claim.get("metadata") or {}).get("labels") or {}
        ledger = self.ledger
        with ledger.lock:
            if not ledger.synced:
                return Verdict(False, NOT_SYNCED)
            state = ledger.state
            node_cards = {spec.name: tuple(card.uuid for card in spec.cards) for spec in state.specs}
            classes, driver = self.claims.classes, self.claims.driver
            try:
                cards = claim_cards(ledger.tenancy, namespace, labels, node_cards)
            except ClaimGroupError as exc:
                return Verdict(False, f"gpupool: {exc}")
        try:
            patch = claim_patch(claim, classes, selector_expressions(cards, driver))
        except ClaimGroupError as exc:
            return Verdict(False, f"gpupool: {exc}")
        if not patch:
            return ALLOWED
        log.debug("claim in %s kept to %s", namespace, cards.why)
        return Verdict(True, patch=patch)
