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
   requests or its limits, and (with ``steer_claims``) the pod names no ResourceClaim: left alone;
5. otherwise ``spec.schedulerName`` is set to gpupool's scheduler.

Claim pods (``steer_claims``, docs/dra.md "Choosing between the extender path and the DRA path"):
gpupool's scheduler asks the extender about every pod it schedules, and the extender chooses the
node of a pod whose claims ask for gpupool's cards. Which DeviceClass a claim asks for is in the
claim (or its template), not in the pod, and this decision reads the pod alone; so every pod that
names a ResourceClaim is steered. One whose claims ask nothing of gpupool gets no opinion from
the extender (every node kube-scheduler passed stays) and a plain Binding: gpupool's scheduler is a
kube-scheduler with the default plugins, DRA's included.

A namespace opts out by the same key as a label: the webhook's ``namespaceSelector`` keeps the
apiserver from asking about its pods at all (deploy/kustomize/components/scheduler-webhook).

"Asks for" means the name appears, whatever the quantity: kube-scheduler sends a pod to an
extender by the same test (``managedResources``), so a pod this rule leaves to the default
scheduler never needs the extender, and one it steers is one the extender expects (with
``steer_claims`` gpupool's scheduler lists no ``managedResources`` and so asks about every pod).

Pure: a function of the pod alone (no cache, no API call), so any live extender replica answers
at once, the leader or not, synced or not.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.api.names import ResourceNames
from gpupool.extender.admission import Verdict
from gpupool.kube.claim_asks import has_claims

DEFAULT_SCHEDULER = "default-scheduler"
"""What the apiserver writes into a pod created without ``schedulerName``."""
GPUPOOL_SCHEDULER = "gpupool-scheduler"
"""The profile of gpupool's own kube-scheduler (deploy/kustomize/base/scheduler-config.yaml)."""
OPT_OUT_VALUE = "default"
"""The value of ``<domain>/scheduler`` (pod annotation, namespace label) that keeps the default scheduler."""
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
"""Sidecars are init containers (``restartPolicy: Always``); ephemeral ones carry no resources
today, and are read anyway so that a future API does not slip past."""


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
                 steer_claims: bool = False) -> None:
        if not scheduler_name or scheduler_name == DEFAULT_SCHEDULER:
            raise ValueError(f"the scheduler to steer GPU pods to must be gpupool's own, got {scheduler_name!r}")
        self.scheduler_name = scheduler_name
        self.steer_claims = steer_claims
        """Steer pods that name ResourceClaims too (the module docstring's "Claim pods")."""
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

    def decide(self, pod: Mapping[str, Any]) -> Steering:
        """The rule of the module docstring applied to ``pod`` (a Pod object as JSON)."""
        annotations = _mapping(_mapping(pod.get("metadata")).get("annotations"))
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
        if self.steer_claims and has_claims(pod):
            return Steering(self.scheduler_name, "names ResourceClaims")
        return Steering(None, "asks for no resource gpupool manages")

    def verdict(self, pod: Mapping[str, Any]) -> Verdict:
        """Allowed, with the JSON patch that sets ``spec.schedulerName`` when the pod is steered."""
        steering = self.decide(pod)
        if steering.scheduler is None:
            return Verdict(True)
        # "add" replaces the member when it exists (RFC 6902), so one operation covers both cases
        return Verdict(True, patch=({"op": "add", "path": "/spec/schedulerName", "value": steering.scheduler},))
