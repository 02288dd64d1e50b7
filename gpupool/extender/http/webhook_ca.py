"""Put the extender's CA into the caBundle of gpupool's webhook configurations.

Without cert-manager (whose CA injector does this), a webhook configuration installed beside the
certificate Job cannot know the CA yet: the Job makes it. Until now the Helm chart left the
webhooks out until a second ``helm upgrade`` could read the CA, and the kustomize overlays without
cert-manager left the pod-scheduler webhook out entirely. ``gpupool certs bootstrap --webhook
KIND/NAME`` now writes the CA into each named configuration itself, right after the Secrets, so one
install gives working webhooks.

Only configurations named on the command line are touched (the RBAC grants get and update on those
names only); every webhook entry of one gets the CA. A configuration not there yet (the Job may run
before the apiserver has it) is waited for up to a bound, then reported missing, not an error: an
overlay may leave a webhook out. Writes are replace-with-resourceVersion, retried on a conflict, so
an admin's or Helm's concurrent change is never overwritten with a stale copy; a configuration whose
entries already carry the CA is not written.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

KINDS = ("mutating", "validating")
CONFLICT_RETRIES = 5


class WebhookTargetError(ValueError):
    """A ``--webhook`` value that is not ``mutating/NAME`` or ``validating/NAME``."""


@dataclass(frozen=True)
class WebhookTarget:
    """One webhook configuration: its kind (``mutating`` or ``validating``) and name."""

    kind: str
    name: str

    @classmethod
    def parse(cls, text: str) -> WebhookTarget:
        kind, sep, name = text.partition("/")
        if not sep or kind not in KINDS or not name or "/" in name:
            raise WebhookTargetError(f"--webhook {text!r}: expected mutating/NAME or validating/NAME")
        return cls(kind, name)

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass
class InjectResult:
    """What one run did to each named configuration."""

    written: list[WebhookTarget] = field(default_factory=list)
    current: list[WebhookTarget] = field(default_factory=list)
    """Every entry already carried the CA: nothing written."""
    missing: list[WebhookTarget] = field(default_factory=list)
    """Not found within the wait (left out by the overlay or the chart's values)."""


def _api_status(exc: Exception) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


class WebhookConfigurations:
    """The two admissionregistration.k8s.io/v1 kinds behind one interface (``AdmissionregistrationV1Api``)."""

    def __init__(self, admission_v1: Any) -> None:
        self.api = admission_v1

    def read(self, target: WebhookTarget) -> Any:
        if target.kind == "mutating":
            return self.api.read_mutating_webhook_configuration(target.name)
        return self.api.read_validating_webhook_configuration(target.name)

    def replace(self, target: WebhookTarget, body: Any) -> None:
        if target.kind == "mutating":
            self.api.replace_mutating_webhook_configuration(target.name, body)
        else:
            self.api.replace_validating_webhook_configuration(target.name, body)


def _with_ca(configuration: Any, ca_bundle: str) -> bool:
    """Set every entry's caBundle to ``ca_bundle``; returns whether anything changed."""
    changed = False
    for webhook in configuration.webhooks or []:
        if webhook.client_config.ca_bundle != ca_bundle:
            webhook.client_config.ca_bundle = ca_bundle
            changed = True
    return changed


def inject_ca(configurations: WebhookConfigurations, ca_pem: bytes, targets: Sequence[WebhookTarget], *,
              wait_s: float = 30.0, poll_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> InjectResult:
    """Write ``ca_pem`` into every entry of each of ``targets``; see the module docstring."""
    ca_bundle = base64.b64encode(ca_pem).decode("ascii")
    result = InjectResult()
    waiting = list(targets)
    deadline = clock() + wait_s
    while True:
        still = []
        for target in waiting:
            outcome = _inject_one(configurations, target, ca_bundle)
            if outcome is None:
                still.append(target)
            elif outcome:
                result.written.append(target)
            else:
                result.current.append(target)
        waiting = still
        if not waiting or clock() >= deadline:
            result.missing.extend(waiting)
            return result
        sleep(poll_s)


def _inject_one(configurations: WebhookConfigurations, target: WebhookTarget, ca_bundle: str) -> bool | None:
    """True: written; False: already current; None: not found."""
    for _ in range(CONFLICT_RETRIES):
        try:
            configuration = configurations.read(target)
        except Exception as exc:
            if _api_status(exc) == 404:
                return None
            raise
        if not _with_ca(configuration, ca_bundle):
            return False
        try:
            configurations.replace(target, configuration)
        except Exception as exc:
            if _api_status(exc) == 409:  # changed since our read: read again
                continue
            if _api_status(exc) == 404:
                return None
            raise
        log.info("wrote the CA into webhook configuration %s", target)
        return True
    raise RuntimeError(f"webhook configuration {target} kept changing under {CONFLICT_RETRIES} writes")
