"""List+watch of the tenancy objects (ResourceGroups, GpuQuotas, Namespaces) into the cache's
:class:`~gpupool.kube.tenancy_book.TenancyBook`, so a change reaches the next filter and bind
without a restart. The loop (resume from the last resourceVersion, re-list on 410 Gone, back-off) is
:mod:`gpupool.kube.listwatch`'s, shared with the node and pod watches.

A cluster without the CRDs installed answers 404 to the custom resources' list: that is taken as an
empty list (no groups, no quotas; the extender is then ready as before) and the watch keeps retrying
with back-off, so installing the CRDs later starts the watch without a restart.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpupool.api.tenancy import API_VERSION
from gpupool.extender.cache import ClusterCache
from gpupool.kube.listwatch import ListFn, ListWatch

log = logging.getLogger(__name__)

EMPTY_LIST = b'{"items": [], "metadata": {"resourceVersion": ""}}'


class _EmptyList:
    """What a list call answers when the resource does not exist (read by :class:`ListWatch`)."""

    data = EMPTY_LIST


def absent_is_empty(kind: str, list_fn: ListFn) -> ListFn:
    """``list_fn`` whose list (not watch) answers an empty list where the API has no such resource."""
    from kubernetes.client.exceptions import ApiException

    def call(**kwargs: Any) -> Any:
        try:
            return list_fn(**kwargs)
        except ApiException as exc:
            if exc.status == 404 and not kwargs.get("watch"):
                log.info("%s: the API has no such resource (CRD not installed?); taken as none", kind)
                return _EmptyList()
            raise

    return call


def _locked(cache: ClusterCache, apply: Callable[..., None]) -> Callable[..., None]:
    def call(*args: Any) -> None:
        with cache.lock:
            apply(*args)
    return call


def _events(cache: ClusterCache, upsert: Callable[[dict[str, Any]], None],
            remove: Callable[[dict[str, Any]], None]) -> Callable[[str, dict[str, Any]], None]:
    def on_event(kind: str, obj: dict[str, Any]) -> None:
        with cache.lock:
            (remove if kind == "DELETED" else upsert)(obj)
    return on_event


def absent_is_none(read: Callable[[], Any]) -> Mapping[str, Any] | None:
    """One object read by ``read``: None where the API has none (404) or answers no object; any
    other failure raises (the webhooks' bounded reads on a cache miss)."""
    from kubernetes.client.exceptions import ApiException

    try:
        obj = read()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return obj if isinstance(obj, Mapping) else None


def api_read_group(api_client: Any, api_group: str) -> Callable[[str, float], Mapping[str, Any] | None]:
    """A bounded read of one ResourceGroup, None when the API has none (the pod-group webhook
    confirms its cache's refusals with it: :mod:`gpupool.extender.group_subjects`)."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)

    def read(name: str, timeout_s: float) -> Mapping[str, Any] | None:
        return absent_is_none(functools.partial(custom.get_cluster_custom_object, api_group, API_VERSION,
                                                "resourcegroups", name, _request_timeout=timeout_s))

    return read


def start_tenancy_watches(cache: ClusterCache, api_client: Any, stop: Any) -> list[ListWatch]:
    """Start the three watches feeding ``cache.tenancy``; returns them (for status and tests)."""
    from kubernetes import client

    book = cache.tenancy
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    group = book.names.api_group

    def custom_list(plural: str) -> ListFn:
        return absent_is_empty(plural, functools.partial(custom.list_cluster_custom_object, group, API_VERSION,
                                                         plural))

    specs: Iterable[tuple[str, ListFn, Callable[..., None], Callable[..., None], Callable[..., None]]] = (
        ("resourcegroups", custom_list("resourcegroups"), book.replace_groups, book.upsert_group,
         book.remove_group),
        ("gpuquotas", custom_list("gpuquotas"), book.replace_quotas, book.upsert_quota, book.remove_quota),
        ("namespaces", core.list_namespace, book.replace_namespaces, book.upsert_namespace,
         book.remove_namespace),
    )
    return [ListWatch(kind, list_fn, _locked(cache, replace), _events(cache, upsert, remove), stop=stop).start()
            for kind, list_fn, replace, upsert, remove in specs]
