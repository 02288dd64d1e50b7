"""Admission of a new pod under its namespace's GPU quotas: reject at create time a pod that can
never fit them (seed 004's quota admission), with the reason the filter would give.

"Never" means: even if the namespace held no GPU at all. The question is the filter's own,
:func:`gpupool.core.quota.refused_models` followed by :func:`gpupool.core.quota.refused_everywhere`
(the pod's demand estimated on each GPU model's largest card, every model closed), asked with
nothing used instead of the ledger's tally. So a pod that fits its limits but not what is left of
them now is admitted (it waits, and the filter refuses it with the reason until room is freed),
and a pod rejected here would be refused by the filter of an empty namespace with the same words.

Pools are not judged here: nodes join with their pool label (a cluster autoscaler scales a pool up
from zero when a pod waits for it), so "no node of the pool exists now" is not "never".

Reads only the extender's caches (the quotas its watch keeps, the ledger's GPU models), under the
cache's lock, so no request costs an API call. Everything that cannot be judged (the cache has not
listed yet, a pod the extender cannot read) is admitted: the filter still decides, and the answer
carries a warning saying why it was not checked. On the webhook's path a GPU pod whose request
cannot be read never gets here: :mod:`gpupool.extender.request_admission` refuses it first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpupool.api.names import ResourceNames
from gpupool.core.quota import refused_everywhere, refused_models
from gpupool.core.usage import ModelUse
from gpupool.extender.ledger_reads import TenancyLedger
from gpupool.kube.tenancy_layers import Admissions
from gpupool.kube.translate import TranslationError, pod_request

NOTHING_USED: ModelUse = {}
"""What an empty namespace holds: the use against which "never fits" is judged."""
NOT_SYNCED_WARNING = ("gpupool: the extender has not listed nodes, pods and quotas yet; GPU quotas were not "
                      "checked at creation (the scheduler still enforces them)")


@dataclass(frozen=True)
class Verdict:
    """Whether the pod may be created; ``reason`` when not; ``warnings`` shown to the client;
    ``patch``: JSON patch operations a mutating webhook applies to the object (empty: none)."""

    allowed: bool
    reason: str = ""
    warnings: tuple[str, ...] = ()
    patch: tuple[Mapping[str, Any], ...] = ()


ALLOWED = Verdict(True)


class QuotaLedger(TenancyLedger, Protocol):
    """What the quota webhook reads: the quotas, and the GPU models' sizes the admissions keep."""

    admissions: Admissions


class QuotaAdmission:
    """Judges new pods against the quotas and GPU models of a :class:`QuotaLedger` (the extender's cache)."""

    def __init__(self, ledger: QuotaLedger, names: ResourceNames) -> None:
        self.ledger = ledger
        self.names = names

    def review(self, pod: Mapping[str, Any], namespace: str) -> Verdict:
        """The verdict on creating ``pod`` in ``namespace`` (the request's namespace: a pod created
        without ``metadata.namespace`` has none in its body)."""
        try:
            request = pod_request(pod, self.names)
        except TranslationError as exc:
            return Verdict(True, warnings=(f"gpupool: {exc}; the scheduler will refuse the pod",))
        if not request.wants_gpu:
            return ALLOWED
        ledger = self.ledger
        with ledger.lock:
            if not ledger.synced:
                return Verdict(True, warnings=(NOT_SYNCED_WARNING,))
            quotas = ledger.tenancy.quotas_of(namespace)
            if not quotas:
                return ALLOWED
            sizes = ledger.admissions.sizes.of(ledger.state)
            reason = refused_everywhere(refused_models(quotas, NOTHING_USED, request, sizes), sizes)
        return ALLOWED if reason is None else Verdict(False, reason)
