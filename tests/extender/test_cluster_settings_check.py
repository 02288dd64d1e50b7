"""The extender places no GPU pod on a node whose agent runs with other cluster settings, and says
why with both values (docs/cluster-config.md); a node that agrees, or published nothing, is used."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from gpupool.api.cluster_settings import AGENT_SETTINGS_ANNOTATION, ClusterSettings
from gpupool.api.names import ResourceNames
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import ExtenderService
from gpupool.kube.translate import pod_request
from tests.extender.modes import EVERY_FIT
from tests.kube.builders import container, node, pod

OURS = ClusterSettings()
NAMES = OURS.resource_names()


def agent_node(name: str, **changes: Any) -> dict[str, Any]:
    """A node whose agent published ``OURS`` with ``changes``; ``None`` as the only change: nothing published."""
    if changes == {"published": None}:
        return node(name, [16384, 16384])
    published = dataclasses.replace(OURS, **changes).published()
    return node(name, [16384, 16384], annotations={AGENT_SETTINGS_ANNOTATION: published})


def service(*nodes: dict[str, Any], settings: ClusterSettings = OURS) -> tuple[ClusterCache, ExtenderService]:
    cache = ClusterCache(settings.resource_names(), policy="binpack", settings=settings)
    cache.replace_nodes(list(nodes))
    cache.replace_pods([])
    return cache, ExtenderService(cache, None, settings=EVERY_FIT)


@pytest.mark.parametrize(("changes", "words"), [
    pytest.param({"gpushare_memory_unit": "MiB"}, "node mib counts gpushare memory (aliyun.com/gpu-mem) in MiB, "
                 "the extender in GiB", id="gpushare-unit"),
    pytest.param({"high_priority_threshold": 10}, "from priority 10 as high priority", id="threshold"),
    pytest.param({"hami": True}, "reads nvidia.com/gpu as HAMi's card count, the extender does not", id="hami"),
    pytest.param({"agent_lease_namespace": "kube-node-lease"}, "Lease in namespace kube-node-lease", id="lease-ns"),
])
def test_a_node_whose_agent_differs_gets_no_gpu_pod_and_the_reason_names_both_values(
        changes: dict[str, Any], words: str) -> None:
    _, extender = service(agent_node("mib", **changes), agent_node("same"), agent_node("old", published=None))
    outcome = extender.filter(pod_request(pod("p", container(gpu_mem=4)), NAMES), ["mib", "same", "old"])
    assert set(outcome.passed) == {"same", "old"}
    reason = outcome.failed["mib"]
    assert words in reason and "ConfigMap gpupool-system/gpupool-cluster" in reason


def test_a_node_whose_agent_names_resources_in_another_domain_is_refused_by_that_name() -> None:
    """Its inventory is under the other domain, so the extender sees no cards there: without the
    published settings the node would only be "no GPUs"."""
    other = dataclasses.replace(OURS, resource_domain="other.io")
    raw = node("n", [16384], annotations={AGENT_SETTINGS_ANNOTATION: other.published()})
    raw["metadata"]["annotations"] = {k.replace("gpupool.io/", "other.io/") if k != AGENT_SETTINGS_ANNOTATION else k: v
                                      for k, v in raw["metadata"]["annotations"].items()}
    _, extender = service(raw, agent_node("same"))
    outcome = extender.filter(pod_request(pod("p", container(gpu=1)), NAMES), ["n", "same"])
    assert outcome.passed == ["same"]
    assert "names resources other.io/gpu-mem..., the extender gpupool.io" in outcome.failed["n"]


def test_the_refusal_ends_when_the_agent_restarts_with_the_cluster_values(caplog: pytest.LogCaptureFixture) -> None:
    cache, extender = service(agent_node("n", gpushare_memory_unit="MiB"))
    request = pod_request(pod("p", container(gpu_mem=4)), NAMES)
    assert extender.filter(request, ["n"]).passed == []
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpupool.extender.cache"):
        cache.upsert_node(agent_node("n", gpushare_memory_unit="MiB"))  # the same again: logged once only
    assert not caplog.records
    cache.upsert_node(agent_node("n"))
    assert extender.filter(request, ["n"]).passed == ["n"] and "n" not in cache.node_problems


def test_the_extenders_own_overrides_are_what_nodes_are_compared_with() -> None:
    mib = dataclasses.replace(OURS, gpushare_memory_unit="MiB")
    _, extender = service(agent_node("mib", gpushare_memory_unit="MiB"), agent_node("gib"), settings=mib)
    outcome = extender.filter(pod_request(pod("p", container(gpu_mem=4)), mib.resource_names()), ["mib", "gib"])
    assert outcome.passed == ["mib"] and "in GiB, the extender in MiB" in outcome.failed["gib"]


def test_a_cache_given_names_only_compares_by_them() -> None:
    cache = ClusterCache(ResourceNames(gpushare_unit_mib=1))
    assert cache.settings == dataclasses.replace(OURS, gpushare_memory_unit="MiB")
