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
from typing import Any

from gpupool.extender.cache import ClusterCache
from gpupool.extender.tenancy_watch import absent_is_empty
from gpupool.kube.listwatch import ListWatch

GROUP = "resource.k8s.io"
VERSION = "v1"
PLURAL = "resourceclaims"


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
