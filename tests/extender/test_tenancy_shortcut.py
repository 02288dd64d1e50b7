"""The admission's shortcut for a pod no tenancy object reaches gives the full walk's answer.

``ClusterCache.admit`` asks the tenancy book one cheap question (:meth:`TenancyBook.leaves_alone`)
before walking the layers; these tests draw books (groups shared or not, broken ones, quotas with
and without pools, namespaces' defaults, readable or not) and pods (with and without a group,
card controls, in covered and uncovered namespaces) and compare the shortcut's admission with
:meth:`Admissions.admit`'s, for a filter and for a bind's node.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.model import Placement
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import ExtenderService
from gpupool.kube.tenancy_layers import Admissions
from tests.extender.modes import EVERY_FIT
from tests.extender.tenancy_world import gpu_pod, group, namespace, pool_node, quota, read, world

NAMESPACES = ("team-a", "team-b", "free")
NODES = ("n1", "n2")

GROUPS = {
    "reserving": group("g1", {"n1": None}),
    "reserving-gpu": group("g2", {"n2": ["GPU-n2-0"]}, subjects=[{"kind": "Namespace", "name": "team-a"}]),
    "shared": group("g3", {"n1": None}, shared=True),
    "broken": {"apiVersion": "gpupool.io/v1alpha1", "kind": "ResourceGroup", "metadata": {"name": "g4"},
               "spec": {"nodes": "not a list"}},
}
QUOTAS = {
    "roomy": lambda ns: quota(ns, hard={"gpupool.io/gpu-core": 400}),
    "tight": lambda ns: quota(ns, "tight", hard={"gpupool.io/gpu-core": 10}),
    "pools": lambda ns: quota(ns, "pooled", pools=["blue"]),
    "broken": lambda ns: quota(ns, "bad", hard={"gpupool.io/gpu-core": "lots"}),
}


def namespace_object(name: str, kind: str) -> dict[str, Any]:
    found = namespace(name, "g1" if kind == "default" else None)
    if kind == "broken":
        found["metadata"]["annotations"] = {"gpupool.io/default-groups": 7}
    return found


books = st.fixed_dictionaries({
    "groups": st.lists(st.sampled_from(sorted(GROUPS)), unique=True),
    "removed": st.lists(st.sampled_from(sorted(GROUPS)), unique=True),
    "quotas": st.lists(st.tuples(st.sampled_from(NAMESPACES[:2]), st.sampled_from(sorted(QUOTAS))),
                       unique=True, max_size=3),
    "namespaces": st.lists(st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(["plain", "default", "broken"])),
                           unique_by=lambda t: t[0]),
})
pods = st.fixed_dictionaries({
    "ns": st.sampled_from(NAMESPACES),
    "group": st.sampled_from([None, "", "g1", "g2", "g3", "g4", "nope"]),
    "annotations": st.sampled_from([None, {"gpupool.io/avoid-gpu-uuids": "GPU-n1-0"},
                                    {"nvidia.com/use-gputype": "V100"}]),
    "size": st.sampled_from([{"gpu_core": 30}, {"whole": 1}, {"gpu_mem": 1024}, {}]),
})


def build(book: dict[str, Any]) -> ClusterCache:
    cache = world([pool_node("n1", 2, "blue"), pool_node("n2", 2, "red")],
                  groups=[GROUPS[g] for g in book["groups"]],
                  quotas=[QUOTAS[kind](ns) for ns, kind in book["quotas"]],
                  namespaces=[namespace_object(ns, kind) for ns, kind in book["namespaces"]])
    with cache.lock:
        for name in book["removed"]:  # the book's record of reserving groups follows removals too
            cache.tenancy.remove_group(GROUPS[name])
    return cache


@settings(max_examples=300, deadline=None)
@given(books, pods)
def test_the_shortcut_admits_as_the_layers_do(book: dict[str, Any], drawn: dict[str, Any]) -> None:
    cache = build(book)
    raw = gpu_pod("p", drawn["ns"], group_label=drawn["group"], annotations=drawn["annotations"], **drawn["size"])
    request, tenant = read(cache, raw)
    with cache.lock:
        for node in (None, *NODES):
            full = cache.admissions.admit(cache.state, request, tenant, node=node)
            assert cache.admit(request, tenant, node) == full
        assert cache.admit(request, None) == cache.admissions.admit(cache.state, request, None)
        if request.wants_gpu and cache.tenancy.leaves_alone(tenant):
            # what the callers then skip would have done nothing: no layer refuses, no quota checks
            assert not full.layers and not full.quotas and full.error is None
            assert full.quota_check(cache.state) is None


@settings(max_examples=100, deadline=None)
@given(books)
def test_the_book_keeps_its_reserving_groups(book: dict[str, Any]) -> None:
    tenancy = build(book).tenancy
    assert tenancy.reserving == {name for name, g in tenancy.groups.items() if not g.shared}


def test_a_plain_pod_is_filtered_and_bound_without_walking_the_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """No group, no controls, a namespace no quota covers: the layers are never asked."""
    cache = world([pool_node("n1", 2, "blue")], quotas=[quota("team-a")], groups=[GROUPS["shared"]])

    def walked(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the tenancy layers were walked")

    monkeypatch.setattr(Admissions, "admit", walked)
    request, tenant = read(cache, gpu_pod("p", "free", gpu_core=30))
    service = ExtenderService(cache, None, settings=EVERY_FIT)
    assert service.filter(request, ["n1"], frozenset(), tenant).passed == ["n1"]
    assert isinstance(cache.reserve(request, "n1", tenant), Placement)
    request, tenant = read(cache, gpu_pod("q", "team-a", gpu_core=30))  # its namespace has a quota
    with pytest.raises(AssertionError, match="layers were walked"):
        cache.reserve(request, "n1", tenant)
