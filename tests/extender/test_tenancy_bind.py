"""Quotas and groups at bind: checked and booked in one step under the ledger's lock."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core.scheduler import Unschedulable
from gpupool.core.usage import Amounts, total
from tests.extender.binder_world import world as binder_world
from tests.extender.tenancy_world import gpu_pod, group, quota, read, world
from tests.kube.builders import node

CARD = 16_384
TENANTS = ("a", "b")


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(TENANTS), st.sampled_from([10, 30, 50, 100]), st.integers(0, 3)),
                min_size=2, max_size=24),
       st.integers(0, 300), st.integers(0, 3))
def test_racing_binds_never_pass_a_quota(pods: list[tuple[str, int, int]], percent: int, whole: int) -> None:
    """Pods of two namespaces are reserved by as many threads, all released at once; whatever the
    order, no namespace ends up holding more than its quota allows."""
    nodes = [f"n{i}" for i in range(4)]
    cache = world([node(n, [CARD] * 4) for n in nodes],
                  quotas=[quota(t, hard={"computePercent": percent, "wholeGpus": whole}) for t in TENANTS])
    asks = []
    for i, (tenant, core, at) in enumerate(pods):
        raw = gpu_pod(f"p{i}", tenant, gpu_core=core) if core < 100 else gpu_pod(f"p{i}", tenant, whole=1)
        asks.append((*read(cache, raw), nodes[at]))
    start = threading.Barrier(len(asks))

    def bind(ask: tuple) -> None:
        request, tenant, at = ask
        start.wait()
        cache.reserve(request, at, tenant)

    threads = [threading.Thread(target=bind, args=(ask,)) for ask in asks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for tenant in TENANTS:
        held = total(cache.state.usage.of(tenant))
        assert held.compute <= percent * 10 and held.cards <= whole, (tenant, held)


def test_a_refused_bind_names_the_quota_and_keeps_the_pods_earlier_booking() -> None:
    cache = world([node("n1", [CARD, CARD])], quotas=[quota("a", hard={"wholeGpus": 1})])
    first, tenant = read(cache, gpu_pod("p", "a", whole=1))
    assert not isinstance(cache.reserve(first, "n1", tenant), Unschedulable)
    second, tenant = read(cache, gpu_pod("q", "a", whole=1))
    refused = cache.reserve(second, "n1", tenant)
    assert isinstance(refused, Unschedulable)
    assert refused.reason == "GpuQuota a/gpus: whole GPUs limit 1, used 1, asked 1"
    again = cache.reserve(first, "n1", tenant)  # a retried bind of p does not count p twice
    assert not isinstance(again, Unschedulable)
    assert cache.state.usage.of("a") == {"Tesla-V100": Amounts(CARD, 1000, 1)}


def test_the_binder_refuses_a_node_outside_the_group_with_the_reason() -> None:
    api, cache, binder = binder_world([node("n1", [CARD]), node("n2", [CARD])])
    with cache.lock:
        cache.tenancy.replace_groups([group("g", {"n1": None})])
    raw = gpu_pod("p", "default", group_label="g", gpu_core=10)
    api.create_pod(raw)
    result = binder.bind("default", "p", raw["metadata"]["uid"], "n2")
    assert result.error == ("pod default/p does not fit on node n2: node is not in resource group g "
                            "(no GPU of the group is on it)")
    assert binder.bind("default", "p", raw["metadata"]["uid"], "n1").ok
