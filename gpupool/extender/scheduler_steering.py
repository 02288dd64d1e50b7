"""Which new pods go to gpupool's own scheduler: the decision of the pod-scheduler webhook.

Why a mutating webhook: managed Kubernetes (EKS, GKE, AKS) does not let an admin reconfigure the
default kube-scheduler, so gpupool runs a second kube-scheduler (profile ``gpupool-scheduler``)
that calls the extender, and this webhook puts the pods that ask for gpupool's resources on it
(``spec.schedulerName``). Users keep writing the pods they wrote for HAMi, gpushare or
GPUManager; nothing else in the cluster changes scheduler.

The rule, in order (the first that applies decides):

1. the pod opts out (annotation ``<domain>/scheduler: default``): left alone;
2. the pod names a scheduler other than the default one: left alone (whoever wrote it meant it);
3. it already names gpupool's scheduler: nothing to do;
4. no container (init, sidecar, app, ephemeral) asks for a resource the extender manages, in its
   requests or its limits, and (with claim steering) no ResourceClaim of the pod asks for
   gpupool's device class or stays unknown: left alone;
5. otherwise ``spec.schedulerName`` is set to gpupool's scheduler.

Claim pods (a :class:`ClaimSource` given, the extender's ``--steer-claim-pods``; docs/dra.md
"Steering claim pods"): gpupool's scheduler asks the extender about every pod it schedules, and the
extender chooses the node of a pod whose claims ask for gpupool's cards. Which DeviceClass a claim
asks for is in the claim (``resourceClaimName``) or, for a claim made per pod, in its template
(``resourceClaimTemplateName``: at pod creation the claim does not exist yet), not in the pod. So
each entry of ``spec.resourceClaims`` is read from the source: the pod is steered when some request
of some claim names gpupool's class, exactly or among its ``firstAvailable`` alternatives
(:func:`gpupool.kube.claim_asks.class_request`); a pod whose claims ask only for other drivers'
devices (a NIC, an FPGA, another GPU driver) keeps the default scheduler.

A claim or template the source does not hold yet (a pod created in the same ``kubectl apply`` as
its template, before the watch delivered it) is fetched from the API, within
:data:`FETCH_BUDGET_S` for the whole pod; one still unknown then (absent, unreadable, out of time)
steers the pod, with that reason: gpupool's scheduler places a pod whose claims ask nothing of
gpupool as the default one would (the extender gives no opinion, a plain Binding), while leaving a
gpupool claim pod to the default scheduler would lose gpupool's node choice for good.

A namespace opts out by the same key as a label: the webhook's ``namespaceSelector`` keeps the
apiserver from asking about its pods at all (deploy/kustomize/components/scheduler-webhook).

"Asks for" means the name appears, whatever the quantity: kube-scheduler sends a pod to an
extender by the same test (``managedResources``), so a pod this rule leaves to the default
scheduler never needs the extender, and one it steers is one the extender expects (with claim
steering gpupool's scheduler lists no ``managedResources`` and so asks about every pod).

Pods that name no claim are decided from the pod alone (no cache, no API call), so any live
extender replica answers at once, the leader or not, synced or not; claim pods read the source
(the replica's watches, an API read on a miss), which every replica runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpupool.api.names import ResourceNames
from gpupool.extender.admission import Verdict
from gpupool.kube.claim_asks import has_claims

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER = "default-scheduler"
"""What the apiserver writes into a pod created without ``schedulerName``."""
GPUPOOL_SCHEDULER = "gpupool-scheduler"
"""The profile of gpupool's own kube-scheduler (deploy/kustomize/base/scheduler-config.yaml)."""
OPT_OUT_VALUE = "default"
"""The value of ``<domain>/scheduler`` (pod annotation, namespace label) that keeps the default scheduler."""
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
"""Sidecars are init containers (``restartPolicy: Always``); ephemeral ones carry no resources
today, and are read anyway so that a future API does not slip past."""


CLAIM = "ResourceClaim"
TEMPLATE = "ResourceClaimTemplate"
FETCH_BUDGET_S = 1.0
"""The time one pod's claims may spend in API reads: the webhook's ``timeoutSeconds`` is 3 s."""
NAME_LIMIT = 64
"""Names in reasons are cut to this length (a reason is logged and may be shown)."""


@dataclass(frozen=True)
class ClaimReading:
    """What one ResourceClaim or ResourceClaimTemplate asks of gpupool: ``request``, the first
    request naming gpupool's device class (None: none does), or ``unknown``, why it could not be
    read (then ``request`` is None)."""

    request: str | None = None
    unknown: str | None = None


class ClaimSource(Protocol):
    """Where the decision reads a pod's claims and templates (gpupool/extender/claim_classes.py)."""

    def cached(self, namespace: str, kind: str, name: str) -> ClaimReading:
        """What the replica's watches hold (no waiting): ``unknown`` when they hold nothing yet."""
        ...  # pragma: no cover

    def fetch(self, namespace: str, kind: str, name: str, timeout_s: float) -> ClaimReading:
        """An API read, bounded by ``timeout_s``: ``unknown`` when absent or unreadable."""
        ...  # pragma: no cover


@dataclass(frozen=True)
class ClaimRef:
    """One entry of ``spec.resourceClaims``: its name in the pod, and the claim or template it names."""

    in_pod: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"claim {self.in_pod[:NAME_LIMIT]!r} ({self.kind} {self.name[:NAME_LIMIT]})"


def claim_refs(spec: Mapping[str, Any]) -> tuple[ClaimRef, ...]:
    """The readable entries of ``spec.resourceClaims`` (one naming neither a claim nor a template,
    or not a mapping, is skipped: the apiserver refuses such a pod after the mutating webhooks)."""
    entries = spec.get("resourceClaims")
    refs = []
    for entry in entries if isinstance(entries, list) else ():
        entry = _mapping(entry)
        in_pod = entry.get("name")
        claim, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        if not isinstance(in_pod, str):
            continue
        if isinstance(claim, str) and claim:
            refs.append(ClaimRef(in_pod, CLAIM, claim))
        elif isinstance(template, str) and template:
            refs.append(ClaimRef(in_pod, TEMPLATE, template))
    return tuple(refs)


def opt_out_key(domain: str) -> str:
    """The annotation (on a pod) and label (on a namespace) that keep the default scheduler."""
    return f"{domain}/scheduler"


@dataclass(frozen=True)
class Steering:
    """The decision on one pod: ``scheduler`` to set, or None to leave it; ``why`` in words."""

    scheduler: str | None
    why: str


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else empty: a malformed part of a pod is asked for nothing
    (the apiserver validates the pod after the mutating webhooks; this must not crash first)."""
    return value if isinstance(value, Mapping) else {}


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for field in CONTAINER_LISTS:
        entries = spec.get(field)
        if isinstance(entries, list):
            for entry in entries:
                yield _mapping(entry)


class SchedulerSteering:
    """Decides, for a pod being created, whether gpupool's scheduler should place it."""

    def __init__(self, names: ResourceNames, scheduler_name: str = GPUPOOL_SCHEDULER, *,
                 claims: ClaimSource | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not scheduler_name or scheduler_name == DEFAULT_SCHEDULER:
            raise ValueError(f"the scheduler to steer GPU pods to must be gpupool's own, got {scheduler_name!r}")
        self.scheduler_name = scheduler_name
        self.claims = claims
        """Where claims are read: given, pods whose claims ask for gpupool's class are steered too
        (the module docstring's "Claim pods"); None, claim pods are not steered."""
        self.clock = clock
        self.managed = frozenset(names.managed())
        self.opt_out = opt_out_key(names.domain)

    def wanted(self, spec: Mapping[str, Any]) -> str | None:
        """The first managed resource a container asks for (requests or limits), if any."""
        for container in _containers(spec):
            resources = _mapping(container.get("resources"))
            for kind in ("requests", "limits"):
                for name in _mapping(resources.get(kind)):
                    if name in self.managed:
                        return str(name)
        return None

    def decide(self, pod: Mapping[str, Any], namespace: str | None = None) -> Steering:
        """The rule of the module docstring applied to ``pod`` (a Pod object as JSON) created in
        ``namespace`` (the admission request's; None: the pod's own)."""
        metadata = _mapping(pod.get("metadata"))
        annotations = _mapping(metadata.get("annotations"))
        if annotations.get(self.opt_out) == OPT_OUT_VALUE:
            return Steering(None, f"annotation {self.opt_out}={OPT_OUT_VALUE}")
        spec = _mapping(pod.get("spec"))
        current = spec.get("schedulerName") or ""
        if current == self.scheduler_name:
            return Steering(None, f"already names {self.scheduler_name}")
        if current not in ("", DEFAULT_SCHEDULER):
            return Steering(None, f"names scheduler {str(current)[:64]!r}")
        resource = self.wanted(spec)
        if resource is not None:
            return Steering(self.scheduler_name, f"asks for {resource}")
        if self.claims is not None and has_claims(pod):
            if namespace is None:
                namespace = str(metadata.get("namespace") or "")
            return self.claim_steering(self.claims, namespace, claim_refs(spec))
        return Steering(None, "asks for no resource gpupool manages")

    def claim_steering(self, source: ClaimSource, namespace: str, refs: tuple[ClaimRef, ...]) -> Steering:
        """The decision on a pod naming ``refs``: steered when one asks for gpupool's class or stays
        unknown, else left to the default scheduler (the module docstring's "Claim pods")."""
        if not refs:
            return Steering(None, "its resourceClaims name no claim or template")
        unknown: list[tuple[ClaimRef, str]] = []
        for ref in refs:
            reading = source.cached(namespace, ref.kind, ref.name)
            if reading.request is not None:
                return self._asks(ref, reading.request)
            if reading.unknown is not None:
                unknown.append((ref, reading.unknown))
        deadline = self.clock() + FETCH_BUDGET_S
        still: list[tuple[ClaimRef, str]] = []
        for ref, _ in unknown:
            left = deadline - self.clock()
            if left <= 0:
                still.append((ref, f"not read within {FETCH_BUDGET_S:g} s"))
                continue
            reading = source.fetch(namespace, ref.kind, ref.name, left)
            if reading.request is not None:
                return self._asks(ref, reading.request)
            if reading.unknown is not None:
                still.append((ref, reading.unknown))
        if still:
            ref, why = still[0]
            return Steering(self.scheduler_name, f"{ref} is not known ({why}): steered, in case it asks for "
                                                 "gpupool's device class")
        return Steering(None, "its claims ask for no gpupool device class")

    def _asks(self, ref: ClaimRef, request: str) -> Steering:
        return Steering(self.scheduler_name, f"{ref} asks for gpupool's device class (request {request!r})")

    def verdict(self, pod: Mapping[str, Any], namespace: str | None = None) -> Verdict:
        """Allowed, with the JSON patch that sets ``spec.schedulerName`` when the pod is steered."""
        steering = self.decide(pod, namespace)
        if log.isEnabledFor(logging.DEBUG):
            metadata = _mapping(pod.get("metadata"))
            where = namespace if namespace is not None else metadata.get("namespace") or ""
            name = metadata.get("name") or "(unnamed)"
            log.debug("pod-scheduler: pod %s/%s: %s (%s)", str(where)[:NAME_LIMIT], str(name)[:NAME_LIMIT],
                      steering.scheduler or "left alone", steering.why)
        if steering.scheduler is None:
            return Verdict(True)
        # "add" replaces the member when it exists (RFC 6902), so one operation covers both cases
        return Verdict(True, patch=({"op": "add", "path": "/spec/schedulerName", "value": steering.scheduler},))
