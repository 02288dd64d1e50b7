"""The quota admission webhook's verdict: a pod that can never fit its namespace's GpuQuotas is
rejected with the filter's reason; one that fits the limits (if not the remainder) is admitted."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.core.model import Placement
from gpupool.extender.admission import NOT_SYNCED_WARNING, QuotaAdmission, Verdict
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import ExtenderService
from tests.extender.tenancy_world import gpu_pod, quota, read, world
from tests.kube.builders import container, node, pod

CARD = 16_384
TWO_MODELS = [node("v", [CARD, CARD], model="V100"), node("t", [CARD, CARD], model="T4")]


def verdict(cache: ClusterCache, raw: dict[str, Any], namespace: str = "team-a") -> Verdict:
    return QuotaAdmission(cache, cache.names).review(raw, namespace)


def filter_reason(cache: ClusterCache, raw: dict[str, Any]) -> str:
    """The one reason the filter refuses ``raw`` with on every node."""
    request, tenant = read(cache, raw)
    outcome = ExtenderService(cache, None).filter(request, ["v", "t"], frozenset(), tenant)
    assert outcome.passed == []
    reasons = set(outcome.failed.values()) | ({outcome.error} if outcome.error else set())
    assert len(reasons) == 1, reasons
    return reasons.pop()


@pytest.mark.parametrize(("quotas", "asked", "reason"), [
    pytest.param([quota("team-a", hard={"wholeGpus": 1})], {"whole": 2},
                 "GpuQuota team-a/gpus: whole GPUs limit 1, used 0, asked 2", id="whole-gpus"),
    pytest.param([quota("team-a", hard={"computePercent": 50})], {"gpu_core": 80},
                 "GpuQuota team-a/gpus: GPU compute (percent of one GPU) limit 50, used 0, asked 80", id="compute"),
    pytest.param([quota("team-a", hard={"memoryMiB": 1000})], {"gpu_mem": 8},
                 "GpuQuota team-a/gpus: GPU memory limit 1000 MiB, used 0 MiB, asked 2048 MiB", id="memory"),
    pytest.param([quota("team-a", models={"V100": {"wholeGpus": 0}, "T4": {"wholeGpus": 0}})], {"whole": 1},
                 "GpuQuota team-a/gpus, GPU model T4: whole GPUs limit 0, used 0, asked 1; "
                 "GpuQuota team-a/gpus, GPU model V100: whole GPUs limit 0, used 0, asked 1", id="every-model"),
    pytest.param([quota("team-a", name="a", hard={"wholeGpus": 4}), quota("team-a", name="b", hard={"wholeGpus": 1})],
                 {"whole": 2}, "GpuQuota team-a/b: whole GPUs limit 1, used 0, asked 2", id="second-quota"),
    pytest.param([quota("team-a", hard={"wholeGpus": -1})], {"whole": 1},
                 "GpuQuota team-a/gpus (unreadable: GpuQuota team-a/gpus: spec.hard.wholeGpus: must be within "
                 "0..2147483648, got -1): GPU memory limit 0 MiB, used 0 MiB, asked 16384 MiB",
                 id="unreadable-quota"),
])
def test_a_pod_over_a_limit_is_denied_with_the_filters_reason(quotas: list[dict[str, Any]], asked: dict[str, int],
                                                               reason: str) -> None:
    cache = world(TWO_MODELS, quotas=quotas)
    raw = gpu_pod("p", "team-a", **asked)
    assert verdict(cache, raw) == Verdict(False, reason)
    assert filter_reason(cache, raw) == reason  # the same words from the same rule


@pytest.mark.parametrize(("quotas", "asked"), [
    pytest.param([quota("team-a", hard={"wholeGpus": 2})], {"whole": 2}, id="at-the-limit"),
    pytest.param([quota("team-a", models={"V100": {"wholeGpus": 0}})], {"whole": 1}, id="another-model-has-room"),
    pytest.param([quota("team-a", pools=["nowhere"])], {"gpu_core": 10}, id="pools-not-judged"),
    pytest.param([quota("team-b", hard={"wholeGpus": 0})], {"whole": 1}, id="another-namespaces-quota"),
    pytest.param([], {"whole": 2}, id="no-quota"),
])
def test_a_pod_within_its_limits_is_admitted(quotas: list[dict[str, Any]], asked: dict[str, int]) -> None:
    assert verdict(world(TWO_MODELS, quotas=quotas), gpu_pod("p", "team-a", **asked)) == Verdict(True)


def test_a_pod_that_fits_the_limit_but_not_the_remainder_is_admitted_and_waits() -> None:
    cache = world(TWO_MODELS, quotas=[quota("team-a", hard={"computePercent": 50})])
    request, tenant = read(cache, gpu_pod("held", "team-a", gpu_core=40))
    assert isinstance(cache.reserve(request, "v", tenant), Placement)
    raw = gpu_pod("p", "team-a", gpu_core=20)
    assert verdict(cache, raw) == Verdict(True)
    assert filter_reason(cache, raw) == "GpuQuota team-a/gpus: GPU compute (percent of one GPU) limit 50, used 40, " \
                                        "asked 20"


def test_pods_without_gpus_and_unreadable_pods_are_admitted() -> None:
    cache = world(TWO_MODELS, quotas=[quota("team-a", hard={"wholeGpus": 0})])
    assert verdict(cache, pod("cpu", {"name": "main", "resources": {}}, namespace="team-a")) == Verdict(True)
    broken = gpu_pod("p", "team-a", gpu_core=150)
    found = verdict(cache, broken)
    assert found.allowed and found.warnings and "the scheduler will refuse the pod" in found.warnings[0]


@pytest.mark.slow
def test_gpu_mem_in_the_wrong_unit_is_admitted_with_the_unit_and_what_to_write() -> None:
    """The client sees at creation why the scheduler will refuse the pod (kubectl prints warnings)."""
    cache = world(TWO_MODELS, quotas=[quota("team-a", hard={"wholeGpus": 4})])
    found = verdict(cache, pod("p", container(gpu_mem="4Gi"), namespace="team-a"))
    assert found.allowed and found.warnings == (
        "gpupool: pod team-a/p container main: gpupool.io/gpu-mem counts 256 MiB units: 4294967296 is 1 EiB; "
        "for 4 GiB write 16; the scheduler will refuse the pod",)


def test_before_the_cache_has_listed_everything_is_admitted_with_a_warning() -> None:
    cache = ClusterCache(policy="binpack", tenancy_required=True)
    cache.replace_nodes(TWO_MODELS)
    cache.replace_pods([])  # quotas not listed yet
    assert verdict(cache, gpu_pod("p", "team-a", whole=1)) == Verdict(True, warnings=(NOT_SYNCED_WARNING,))


def test_the_namespace_comes_from_the_request() -> None:
    cache = world(TWO_MODELS, quotas=[quota("team-a", hard={"wholeGpus": 0})])
    raw = gpu_pod("p", "default", whole=1)
    assert not verdict(cache, raw, "team-a").allowed
    assert verdict(cache, raw, "default").allowed
