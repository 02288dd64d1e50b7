"""Where the pod-scheduler webhook reads which device classes a pod's claims ask for
(:class:`gpupool.extender.scheduler_steering.ClaimSource`, docs/dra.md "Steering claim pods").

Claims come from the extender's claim watch (``--dra-claims``, :mod:`gpupool.extender.dra_watch`),
whose store already reads each claim's requests (:attr:`gpupool.kube.claim_asks.ClaimAsk.named`).
Templates come from their own watch (:func:`gpupool.extender.dra_watch.start_template_watch`,
started with ``--steer-claim-pods`` only), kept here as the one thing the decision needs: the name of
the first request naming gpupool's class, per template. On a miss (a watch not listed yet, an object
created a moment before the pod) the webhook reads the object itself with ``get``, bounded in time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpupool.extender.dra_bookings import ClaimBookings
from gpupool.extender.scheduler_steering import CLAIM, TEMPLATE, ClaimReading
from gpupool.kube.claim_asks import class_request
from gpupool.kube.claim_holding import claim_key

log = logging.getLogger(__name__)

NOT_FOUND = "not found"

Get = Callable[[str, str, str, float], Mapping[str, Any] | None]
"""``get(kind, namespace, name, timeout_s)``: the object as JSON, None when the API has none; raises
on any other failure."""


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _key(obj: Mapping[str, Any]) -> str:
    meta = _map(obj.get("metadata"))
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def template_request(obj: Mapping[str, Any], classes: frozenset[str]) -> str | None:
    """The first request of template ``obj`` (its ``spec.spec``, the claim it makes) naming one of ``classes``."""
    return class_request(_map(obj.get("spec")).get("spec"), classes)


class TemplateClasses:
    """Per ResourceClaimTemplate (``namespace/name``), the first request naming gpupool's class or
    None; fed by the template watch (its own lock: the ledger's is not needed)."""

    def __init__(self, classes: frozenset[str]) -> None:
        self.classes = classes
        self.lock = threading.Lock()
        self.named: dict[str, str | None] = {}
        self.synced = False

    def replace(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """A full list of templates."""
        named = {_key(obj): template_request(obj, self.classes) for obj in objs if isinstance(obj, Mapping)}
        with self.lock:
            self.named = named
            self.synced = True

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One watch event."""
        if not isinstance(obj, Mapping):
            return
        key = _key(obj)
        with self.lock:
            if kind == "DELETED":
                self.named.pop(key, None)
            else:
                self.named[key] = template_request(obj, self.classes)

    def cached(self, namespace: str, name: str) -> ClaimReading:
        with self.lock:
            if not self.synced:
                return ClaimReading(unknown="templates not listed yet")
            if f"{namespace}/{name}" not in self.named:
                return ClaimReading(unknown="not in the template watch")
            return ClaimReading(self.named[f"{namespace}/{name}"])


class WatchedClaimClasses:
    """The webhook's :class:`~gpupool.extender.scheduler_steering.ClaimSource`: the claim and
    template watches, and ``get`` on a miss."""

    def __init__(self, claims: ClaimBookings, ledger_lock: threading.RLock, templates: TemplateClasses,
                 get: Get) -> None:
        self.claims = claims
        self.ledger_lock = ledger_lock
        self.templates = templates
        self.get = get

    def cached(self, namespace: str, kind: str, name: str) -> ClaimReading:
        if kind == TEMPLATE:
            return self.templates.cached(namespace, name)
        with self.ledger_lock:
            if not self.claims.synced:
                return ClaimReading(unknown="claims not listed yet")
            ask = self.claims.asks.get(claim_key(namespace, name))
        if ask is None:
            return ClaimReading(unknown="not in the claim watch")
        return ClaimReading(ask.named)

    def fetch(self, namespace: str, kind: str, name: str, timeout_s: float) -> ClaimReading:
        try:
            obj = self.get(kind, namespace, name, timeout_s)
        except Exception as exc:  # a timeout, a refusal, a broken connection: the reason, never a crash
            log.info("pod-scheduler: %s %s/%s cannot be read: %s", kind, namespace, name, exc)
            return ClaimReading(unknown=f"cannot be read: {type(exc).__name__}")
        log.debug("pod-scheduler: %s %s/%s read from the API (%s)", kind, namespace, name,
                  "absent" if obj is None else "found")
        if obj is None:
            return ClaimReading(unknown=NOT_FOUND)
        if kind == CLAIM:
            return ClaimReading(class_request(_map(obj).get("spec"), self.claims.classes))
        return ClaimReading(template_request(_map(obj), self.templates.classes))
