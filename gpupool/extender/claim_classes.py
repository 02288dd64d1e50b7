"""Where the pod-scheduler webhook reads which device classes a pod's claims ask for
(:class:`gpupool.extender.scheduler_steering.ClaimSource`, docs/dra.md "Steering claim pods").

Claims come from the extender's claim watch (``--dra-claims``, :mod:`gpupool.extender.dra_watch`),
whose store already reads each claim's requests (:attr:`gpupool.kube.claim_asks.ClaimAsk.named`).
Templates come from their own watch (:func:`gpupool.extender.dra_watch.start_template_watch`,
started with ``--steer-claim-pods`` only), kept here as each template's claim spec, read against
gpupool's classes of the moment (the DeviceClass watch, :mod:`gpupool.extender.gpupool_classes`,
adds admins' classes of gpupool's driver; until it has listed, a claim or template naming no class
known to be gpupool's is unknown, so its pod is steered). On a miss (a watch not listed yet, an object
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
        """gpupool's classes now (the DeviceClass watch replaces it, :mod:`gpupool.extender.gpupool_classes`)."""
        self.lock = threading.Lock()
        self.specs: dict[str, object] = {}
        """Each template's claim spec (``spec.spec``): read against the classes of the moment."""
        self.synced = False

    def replace(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """A full list of templates."""
        specs = {_key(obj): _map(obj.get("spec")).get("spec") for obj in objs if isinstance(obj, Mapping)}
        with self.lock:
            self.specs = specs
            self.synced = True

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One watch event."""
        if not isinstance(obj, Mapping):
            return
        key = _key(obj)
        with self.lock:
            if kind == "DELETED":
                self.specs.pop(key, None)
            else:
                self.specs[key] = _map(obj.get("spec")).get("spec")

    def cached(self, namespace: str, name: str) -> ClaimReading:
        with self.lock:
            if not self.synced:
                return ClaimReading(unknown="templates not listed yet")
            if f"{namespace}/{name}" not in self.specs:
                return ClaimReading(unknown="not in the template watch")
            spec = self.specs[f"{namespace}/{name}"]
        return ClaimReading(class_request(spec, self.classes))


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
            if not self.claims.classes_synced:
                return ClaimReading(unknown="device classes not listed yet")
            return self.templates.cached(namespace, name)
        with self.ledger_lock:
            if not self.claims.synced:
                return ClaimReading(unknown="claims not listed yet")
            if not self.claims.classes_synced:
                return ClaimReading(unknown="device classes not listed yet")
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
            found = class_request(_map(obj).get("spec"), self.claims.classes)
        else:
            found = template_request(_map(obj), self.templates.classes)
        if found is None and not self.claims.classes_synced:  # an admin's class of gpupool's driver, maybe
            return ClaimReading(unknown="device classes not listed yet")
        return ClaimReading(found)
