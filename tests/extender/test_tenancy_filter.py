"""Filter and prioritize under resource groups, quotas, pools and per-pod card controls."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.core.model import Placement
from gpupool.core.scheduler import Unschedulable
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import ExtenderService, FilterOutcome
from tests.extender.modes import EVERY_FIT
from tests.extender.tenancy_world import gpu_pod, group, namespace, pool_node, quota, read, world
from tests.kube.builders import node

NODES = ["n1", "n2", "n3"]
CARD = 16_384


def cluster(**tenancy: Any) -> ClusterCache:
    return world([node(n, [CARD, CARD]) for n in NODES], **tenancy)


def run_filter(cache: ClusterCache, raw: dict[str, Any], names: list[str] | None = None) -> FilterOutcome:
    """Every node that fits the pod's tenancy (:data:`EVERY_FIT`, not the shipped one-best mode)."""
    request, tenant = read(cache, raw)
    return ExtenderService(cache, None, settings=EVERY_FIT).filter(request, names or NODES, frozenset(), tenant)


TEAM_A = group("team-a", {"n1": None, "n2": ["GPU-n2-1"]}, subjects=[{"kind": "Namespace", "name": "team-a"}])


@pytest.mark.parametrize(("label", "ns", "passed", "reason"), [
    pytest.param("team-a", "team-a", ["n1", "n2"], {}, id="group-nodes"),
    pytest.param("nope", "team-a", [], dict.fromkeys(NODES, "resource group nope does not exist"), id="unknown"),
    pytest.param("team-a", "team-b", [], dict.fromkeys(NODES, "resource group team-a does not admit namespace "
                                                              "team-b (ServiceAccount default)"), id="not-admitted"),
    pytest.param(None, "team-b", ["n2", "n3"], {}, id="no-group-keeps-off-reserved-cards"),
])
def test_filter_keeps_a_pod_on_its_group(label: str | None, ns: str, passed: list[str],
                                         reason: dict[str, str]) -> None:
    """Nodes outside the pod's cards are neither passed nor explained while some node passes
    (kube-scheduler shows reasons only for a pod that fits nowhere; see the next test)."""
    outcome = run_filter(cluster(groups=[TEAM_A]), gpu_pod("p", ns, group_label=label, gpu_core=30))
    assert outcome.passed == passed
    assert outcome.failed == reason


def test_nodes_outside_are_explained_when_the_pod_fits_nowhere() -> None:
    cache = cluster(groups=[TEAM_A])
    for i in range(3):  # the group's three GPUs held whole
        request, tenant = read(cache, gpu_pod(f"held{i}", "team-a", group_label="team-a", whole=1))
        assert isinstance(cache.reserve(request, "n1" if i < 2 else "n2", tenant), Placement)
    outcome = run_filter(cache, gpu_pod("p", "team-a", group_label="team-a", whole=1))
    assert outcome.passed == []
    assert outcome.failed == {
        "n1": "needs 1 idle whole card(s); 0 idle", "n2": "needs 1 idle whole card(s); 0 idle",
        "n3": "node is not in resource group team-a (no GPU of the group is on it)"}
    outcome = run_filter(cache, gpu_pod("q", "team-b", whole=1), ["n1"])
    assert outcome.failed == {"n1": "every GPU of this node is reserved by a resource group; name one in the "
                                    "pod label gpupool.io/group"}


def test_the_bind_takes_only_the_groups_gpu_on_a_shared_node() -> None:
    cache = cluster(groups=[TEAM_A])
    request, tenant = read(cache, gpu_pod("p", "team-a", group_label="team-a", gpu_core=30))
    placement = cache.reserve(request, "n2", tenant)
    assert isinstance(placement, Placement), placement
    assert [s.card for c in placement.containers for s in c.slices] == [1]
    request, tenant = read(cache, gpu_pod("q", "team-b", gpu_core=30))
    outside = cache.reserve(request, "n1", tenant)
    assert isinstance(outside, Unschedulable)
    assert outside.reason.startswith("every GPU of this node is reserved")


def test_a_shared_group_leaves_its_cards_open_to_pods_without_a_group() -> None:
    shared = group("open", {"n1": None}, shared=True)
    assert run_filter(cluster(groups=[shared]), gpu_pod("p", "x", gpu_core=30)).passed == NODES


def test_namespace_default_groups_choose_the_best_fit() -> None:
    small = group("small", {"n3": ["GPU-n3-0"]})
    big = group("big", {"n1": None, "n2": None})
    cache = cluster(groups=[small, big], namespaces=[namespace("team-a", "big,small")])
    assert run_filter(cache, gpu_pod("p", "team-a", gpu_core=30)).passed == ["n3"]
    assert run_filter(cache, gpu_pod("p", "team-a", whole=2)).passed == ["n1", "n2"]


def test_quota_refuses_at_filter_naming_limit_used_and_asked() -> None:
    cache = cluster(quotas=[quota("team-a", hard={"computePercent": 50})])
    request, tenant = read(cache, gpu_pod("held", "team-a", gpu_core=40))
    assert not hasattr(cache.reserve(request, "n1", tenant), "reason")
    outcome = run_filter(cache, gpu_pod("p", "team-a", gpu_core=20))
    assert outcome.passed == []
    assert set(outcome.failed.values()) == {
        "GpuQuota team-a/gpus: GPU compute (percent of one GPU) limit 50, used 40, asked 20"}
    assert run_filter(cache, gpu_pod("p", "team-a", gpu_core=10)).passed == NODES
    assert run_filter(cache, gpu_pod("p", "team-b", gpu_core=90)).passed == NODES  # another namespace


def test_per_model_quota_closes_only_that_model() -> None:
    cache = world([node("v", [CARD], model="V100"), node("t", [CARD], model="T4")],
                  quotas=[quota("team-a", models={"V100": {"wholeGpus": 0}})])
    outcome = run_filter(cache, gpu_pod("p", "team-a", whole=1), ["v", "t"])
    assert outcome.passed == ["t"]
    outcome = run_filter(cache, gpu_pod("p", "team-a", whole=1), ["v"])
    assert outcome.failed == {"v": "GpuQuota team-a/gpus, GPU model V100: whole GPUs limit 0, used 0, asked 1"}


def test_pools_keep_a_namespace_on_its_nodes() -> None:
    cache = world([pool_node("p1", 1, "public"), pool_node("w1", 1, "wx")],
                  quotas=[quota("team-a", pools=["public"])])
    outcome = run_filter(cache, gpu_pod("p", "team-a", gpu_core=10), ["p1", "w1"])
    assert outcome.passed == ["p1"]
    outcome = run_filter(cache, gpu_pod("p", "team-a", gpu_core=10), ["w1"])
    assert outcome.failed == {"w1": "node is not in a pool GpuQuota team-a/gpus allows (public; node label "
                                    "gpupool.io/pool)"}


@pytest.mark.parametrize(("annotations", "passed"), [
    pytest.param({"gpupool.io/gpu-uuids": "GPU-n2-0, GPU-n3-1"}, ["n2", "n3"], id="pin"),
    pytest.param({"nvidia.com/use-gpuuuid": "GPU-n2-0"}, ["n2"], id="pin-hami-alias"),
    pytest.param({"gpupool.io/avoid-gpu-uuids": "GPU-n1-0,GPU-n1-1"}, ["n2", "n3"], id="avoid-uuids"),
    pytest.param({"gpupool.io/avoid-gpu-models": "Tesla-V100"}, [], id="avoid-model"),
    pytest.param({"gpupool.io/gpu-uuids": "GPU-elsewhere"}, [], id="pin-to-no-card-here"),
    pytest.param({"nvidia.com/use-gputype": "v100"}, NODES, id="hami-use-type-is-a-word-of-the-model-any-case"),
    pytest.param({"nvidia.com/use-gputype": "A100,T4"}, [], id="hami-use-type-of-no-model-here"),
    pytest.param({"nvidia.com/nouse-gputype": "V100"}, [], id="hami-avoid-type-is-a-word-of-the-model"),
    pytest.param({"gpupool.io/avoid-gpu-models": "V100"}, NODES, id="gpupool-avoid-model-is-exact"),
])
def test_pod_card_controls(annotations: dict[str, str], passed: list[str]) -> None:
    outcome = run_filter(cluster(), gpu_pod("p", "x", gpu_core=10, annotations=annotations))
    assert outcome.passed == passed
    expected = {} if passed else dict.fromkeys(NODES, "no GPU of this node is allowed by the pod's annotations "
                                                      "(pinned or avoided GPUs, wanted or avoided GPU models)")
    assert outcome.failed == expected


@pytest.mark.parametrize(("annotations", "passed"), [
    pytest.param({"nvidia.com/use-gputype": "a100"}, ["a"], id="use"),
    pytest.param({"nvidia.com/use-gputype": "A100,T4"}, ["a", "t"], id="use-either"),
    pytest.param({"nvidia.com/nouse-gputype": "t4"}, ["a", "h"], id="avoid"),
    pytest.param({"nvidia.com/use-gputype": "NVIDIA", "nvidia.com/nouse-gputype": "H100"}, ["a"], id="both"),
])
def test_hami_model_words_match_as_hami_matches_them(annotations: dict[str, str], passed: list[str]) -> None:
    """HAMi matches a type as a word of the card's model, any case: ``A100`` names the
    ``NVIDIA-A100-SXM4-80GB``; gpupool's own ``avoid-gpu-models`` keeps naming models exactly."""
    cache = world([node("a", [CARD], model="NVIDIA-A100-SXM4-80GB"), node("t", [CARD], model="Tesla-T4"),
                   node("h", [CARD], model="NVIDIA-H100-80GB-HBM3")])
    outcome = run_filter(cache, gpu_pod("p", "x", gpu_core=10, annotations=annotations), ["a", "t", "h"])
    assert outcome.passed == passed


def test_broken_objects_are_reported_and_treated_conservatively() -> None:
    broken_group = group("team-a", {"n1": None})
    broken_group["spec"]["shared"] = "yes"
    broken_quota = quota("team-b", hard={"wholeGpus": -1})
    cache = cluster(groups=[broken_group], quotas=[broken_quota])
    outcome = run_filter(cache, gpu_pod("p", "team-a", group_label="team-a", gpu_core=10))
    assert set(outcome.failed.values()) == {
        "ResourceGroup team-a cannot be read: ResourceGroup team-a: spec.shared: expected true or false, got 'yes'"}
    outcome = run_filter(cache, gpu_pod("p", "team-b", gpu_core=10))
    assert outcome.passed == []
    assert "GpuQuota team-b/gpus (unreadable: GpuQuota team-b/gpus: spec.hard.wholeGpus: must be within" in \
        next(iter(outcome.failed.values()))
    assert set(cache.tenancy.problems()) == {"ResourceGroup team-a", "GpuQuota team-b/gpus"}


def test_a_quota_with_an_empty_model_name_is_refused_with_the_quota_and_the_key() -> None:
    """The CRD refuses it now; one stored before (or under an older CRD) still refuses the
    namespace's GPU pods (a broken limit is not lifted), saying which quota and which key."""
    cache = cluster(quotas=[quota("team-b", hard={"wholeGpus": 4}, models={"": {"wholeGpus": 1}})])
    outcome = run_filter(cache, gpu_pod("p", "team-b", gpu_core=10))
    assert outcome.passed == []
    assert set(outcome.failed.values()) == {
        "GpuQuota team-b/gpus (unreadable: GpuQuota team-b/gpus: spec.models has an empty GPU model name (key ''); "
        "name the model as the node inventory shows it, or remove the entry): GPU memory limit 0 MiB, used 0 MiB, "
        "asked 1638 MiB"}
    assert cache.tenancy.problems()["GpuQuota team-b/gpus"].startswith("GpuQuota team-b/gpus: spec.models has an")


def test_a_gpu_listed_under_the_wrong_node_is_left_out_and_reported() -> None:
    cache = cluster(groups=[group("g", {"n1": ["GPU-n2-0"]})])
    outcome = run_filter(cache, gpu_pod("p", "x", group_label="g", gpu_core=10))
    assert outcome.passed == []
    assert cache.admissions.group_problems == {
        "g/n1": "ResourceGroup g: GPU(s) GPU-n2-0 are not on node n1; left out of the group"}


def test_a_group_change_reaches_the_next_filter_and_prioritize() -> None:
    cache = cluster(groups=[group("g", {"n1": None})])
    raw = gpu_pod("p", "x", group_label="g", gpu_core=10)
    service = ExtenderService(cache, None)
    request, tenant = read(cache, raw)
    assert service.filter(request, NODES, frozenset(), tenant).passed == ["n1"]
    with cache.lock:
        cache.tenancy.upsert_group(group("g", {"n3": None}))
    assert service.filter(request, NODES, frozenset(), tenant).passed == ["n3"]
    scores, _ = service.prioritize(request, ["n1", "n3"], frozenset(), tenant)
    assert scores.as_dict()["n1"] == 0 and scores.as_dict()["n3"] == 10


def test_a_node_refused_for_another_reason_keeps_that_reason_on_every_filter() -> None:
    broken = node("n3", [CARD])
    broken["metadata"]["annotations"]["gpupool.io/inventory-v1"] = "{not json"
    cache = world([node("n1", [CARD]), node("n2", [CARD]), broken], groups=[group("g", {"n1": None})])
    service = ExtenderService(cache, None)
    held, tenant = read(cache, gpu_pod("held", "x", group_label="g", whole=1))
    assert isinstance(cache.reserve(held, "n1", tenant), Placement)
    request, tenant = read(cache, gpu_pod("p", "x", group_label="g", gpu_core=10))
    for _ in range(3):  # the second and third filters answer from the remembered layer refusals
        outcome = service.filter(request, NODES, frozenset(), tenant)
        assert outcome.passed == []
        assert outcome.failed["n2"] == "node is not in resource group g (no GPU of the group is on it)"
        assert "inventory-v1" in outcome.failed["n3"]
