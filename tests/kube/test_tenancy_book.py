"""The tenancy store: events, versions, readiness, and the watch's handling of missing CRDs."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpupool.extender.cache import ClusterCache
from gpupool.extender.tenancy_watch import EMPTY_LIST, absent_is_empty
from gpupool.kube.tenancy_book import TenancyBook
from tests.extender.tenancy_world import group, namespace, quota


def test_every_change_moves_the_version_and_a_repeat_does_not() -> None:
    book = TenancyBook()
    steps = [lambda: book.upsert_group(group("g", {"n1": None})),
             lambda: book.upsert_quota(quota("ns", hard={"wholeGpus": 1})),
             lambda: book.upsert_namespace(namespace("ns", "g")),
             lambda: book.remove_group(group("g", {})),
             lambda: book.remove_quota(quota("ns")),
             lambda: book.remove_namespace(namespace("ns"))]
    for step in steps:
        before = book.version
        step()
        assert book.version == before + 1
    for step in steps[3:]:
        before = book.version
        step()
        assert book.version == before  # nothing was there to remove
    book.upsert_group(group("g", {"n1": None}))
    before = book.version
    book.upsert_group(group("g", {"n1": None}))  # a resync of the same object
    assert book.version == before


def test_a_group_fixed_after_being_broken_is_usable_again() -> None:
    book = TenancyBook()
    broken = group("g", {"n1": None})
    broken["spec"]["nodes"] = "n1"
    book.upsert_group(broken)
    assert "g" in book.broken_groups and "g" not in book.groups
    book.upsert_group(group("g", {"n1": None}))
    assert "g" not in book.broken_groups and "g" in book.groups
    assert book.problems() == {}


def test_readiness_waits_for_every_tenancy_list_when_required() -> None:
    cache = ClusterCache(tenancy_required=True)
    cache.replace_nodes([])
    cache.replace_pods([])
    assert not cache.synced
    cache.tenancy.replace_groups([])
    cache.tenancy.replace_quotas([])
    assert not cache.synced
    cache.tenancy.replace_namespaces([])
    assert cache.synced
    optional = ClusterCache()
    optional.replace_nodes([])
    optional.replace_pods([])
    assert optional.synced


def test_a_missing_crd_lists_as_empty_and_its_watch_keeps_failing() -> None:
    def missing(**kwargs: Any) -> Any:
        raise ApiException(status=404, reason="Not Found")

    call = absent_is_empty("resourcegroups", missing)
    assert call(limit=500).data == EMPTY_LIST
    with pytest.raises(ApiException):
        call(watch=True, resource_version="")

    def forbidden(**kwargs: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ApiException):
        absent_is_empty("gpuquotas", forbidden)(limit=500)
