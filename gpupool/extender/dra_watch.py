"""List+watch of ResourceClaims (``resource.k8s.io/v1``) into the cache's claim bookings, so a
claim the DRA allocator places on a card is in the extender's ledger before its next filter
(:mod:`gpupool.extender.dra_bookings`). The loop is :mod:`gpupool.kube.listwatch`'s.

Claims are listed through the generic custom-object call (``/apis/resource.k8s.io/v1/resourceclaims``
is an ordinary API path), so the extender needs no client models of the DRA API. A cluster without
``resource.k8s.io/v1`` (before 1.34) answers 404: taken as no claims, and the watch keeps retrying,
so an upgraded control plane is picked up without a restart.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gpupool.extender.cache import ClusterCache
from gpupool.extender.claim_classes import Get, TemplateClasses
from gpupool.extender.gpupool_classes import GpupoolClasses
from gpupool.extender.scheduler_steering import CLAIM, TEMPLATE
from gpupool.extender.tenancy_watch import absent_is_empty, absent_is_none
from gpupool.kube.listwatch import ListWatch

GROUP = "resource.k8s.io"
VERSION = "v1"
PLURAL = "resourceclaims"
TEMPLATES = "resourceclaimtemplates"
CLASSES = "deviceclasses"
PLURALS = {CLAIM: PLURAL, TEMPLATE: TEMPLATES}


def apply_claim_event(cache: ClusterCache, kind: str, obj: dict[str, Any]) -> None:
    """One claim event into the cache's ledger."""
    with cache.lock:
        (cache.claims.remove if kind == "DELETED" else cache.claims.upsert)(obj)


def replace_claims(cache: ClusterCache, objs: Any) -> None:
    """A full list of claims into the cache's ledger."""
    with cache.lock:
        cache.claims.replace(objs)


def start_claim_watch(cache: ClusterCache, api_client: Any, stop: Any) -> ListWatch:
    """Start the claims' list+watch feeding ``cache``; readiness waits for its first list."""
    from kubernetes import client

    cache.claims.required = True
    custom = client.CustomObjectsApi(api_client)
    list_fn = absent_is_empty(PLURAL, functools.partial(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL))
    return ListWatch(PLURAL, list_fn, functools.partial(replace_claims, cache),
                     functools.partial(apply_claim_event, cache), stop=stop).start()


def start_template_watch(templates: TemplateClasses, api_client: Any, stop: Any) -> ListWatch:
    """Start the ResourceClaimTemplates' list+watch feeding ``templates`` (``--steer-claim-pods``:
    the pod-scheduler webhook reads which class a template's claims will ask for)."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    list_fn = absent_is_empty(TEMPLATES, functools.partial(custom.list_cluster_custom_object, GROUP, VERSION,
                                                           TEMPLATES))
    return ListWatch(TEMPLATES, list_fn, templates.replace, templates.apply, stop=stop).start()


def start_class_watch(classes: GpupoolClasses, api_client: Any, stop: Any) -> ListWatch:
    """Start the DeviceClasses' list+watch feeding ``classes`` (``--steer-claim-pods``: admins' classes
    of gpupool's driver and their selectors); a claim pod's filter waits for its first list."""
    from kubernetes import client

    classes.claims.classes_synced = False
    custom = client.CustomObjectsApi(api_client)
    list_fn = absent_is_empty(CLASSES, functools.partial(custom.list_cluster_custom_object, GROUP, VERSION,
                                                         CLASSES))
    return ListWatch(CLASSES, list_fn, classes.replace, classes.apply, stop=stop).start()


def api_get(api_client: Any) -> Get:
    """A bounded read of one claim or template, None when the API has none (the webhook's miss path)."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)

    def get(kind: str, namespace: str, name: str, timeout_s: float) -> Mapping[str, Any] | None:
        return absent_is_none(functools.partial(custom.get_namespaced_custom_object, GROUP, VERSION, namespace,
                                                PLURALS[kind], name, _request_timeout=timeout_s))

    return get
