"""HAMi's and gpushare's manifests, unchanged, into the core's request: every shape and every refusal."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuKind, GpuRequest, PodRequest
from gpupool.core.pod_policy import PolicyChoice
from gpupool.kube.translate import TranslationError, foreign_resources, pod_request, pod_wants_gpu

NAMES = ResourceNames()
HAMI = ResourceNames(hami=True)
MIB_GPUSHARE = ResourceNames(gpushare_unit_mib=1)
GPU, MEM, PCT, CORES, PRIO = ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
                              "nvidia.com/gpucores", "nvidia.com/priority")
ALIYUN_MEM = "aliyun.com/gpu-mem"


def manifest(limits: dict[str, Any], *, annotations: dict[str, str] | None = None,
             labels: dict[str, str] | None = None, init: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod as a user of HAMi or gpushare writes it: one container, limits only."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {
        "limits": {k: str(v) for k, v in limits.items()}}}]}
    if init is not None:
        spec["initContainers"] = [{"name": "setup", "resources": {"limits": {k: str(v) for k, v in init.items()}}}]
    return {"metadata": {"name": "p", "namespace": "default", "annotations": annotations or {},
                         "labels": labels or {}}, "spec": spec}


def translated(limits: dict[str, Any], names: ResourceNames = NAMES, **kw: Any) -> PodRequest:
    return pod_request(manifest(limits, **kw), names)


@pytest.mark.parametrize(("limits", "names", "expected"), [
    pytest.param({GPU: 1, MEM: 3000}, NAMES, GpuRequest(memory_mib=3000), id="hami-gpumem-mib"),
    pytest.param({GPU: 1, MEM: 3000, CORES: 30}, NAMES, GpuRequest(compute=300, memory_mib=3000),
                 id="hami-gpumem-and-gpucores"),
    pytest.param({GPU: 2, MEM: 3000, CORES: 30}, NAMES, GpuRequest(count=2, compute=300, memory_mib=3000),
                 id="hami-two-cards-each-getting-the-slice"),
    pytest.param({GPU: 1, PCT: 25}, NAMES, GpuRequest(memory_mib=0, memory_share=250),
                 id="hami-memory-percentage"),
    pytest.param({GPU: 1, PCT: 25, CORES: 30}, NAMES, GpuRequest(compute=300, memory_mib=0, memory_share=250),
                 id="hami-memory-percentage-and-cores"),
    pytest.param({GPU: 1, MEM: 3000, PCT: 25}, NAMES, GpuRequest(memory_mib=3000),
                 id="hami-gpumem-wins-over-percentage-as-in-hami"),
    pytest.param({GPU: 1, CORES: 30}, NAMES, GpuRequest(compute=300, memory_mib=0, memory_share=1000),
                 id="hami-cores-alone-take-the-whole-memory-hami-default"),
    pytest.param({GPU: 1, CORES: 100}, NAMES, GpuRequest.whole(1), id="hami-cores-100-is-exclusive"),
    pytest.param({GPU: 2, MEM: 4000, CORES: 100}, NAMES, GpuRequest.whole(2), id="hami-cores-100-two-cards"),
    pytest.param({GPU: 3}, HAMI, GpuRequest.whole(3), id="hami-gpu-alone-whole-cards"),
    pytest.param({GPU: 1, MEM: 3000, PRIO: 1}, NAMES, GpuRequest(memory_mib=3000), id="hami-priority-low"),
    pytest.param({GPU: 1, MEM: 3000, PRIO: 0}, NAMES, GpuRequest(memory_mib=3000), id="hami-priority-high"),
    pytest.param({MEM: 3000}, NAMES, GpuRequest(memory_mib=3000), id="hami-without-gpu-is-one-card-as-its-webhook"),
    pytest.param({ALIYUN_MEM: 4}, NAMES, GpuRequest(memory_mib=4096), id="gpushare-gib"),
    pytest.param({ALIYUN_MEM: 4000}, MIB_GPUSHARE, GpuRequest(memory_mib=4000), id="gpushare-mib"),
])
def test_foreign_manifests_read_as_their_project_means_them(limits: dict[str, Any], names: ResourceNames,
                                                            expected: GpuRequest) -> None:
    assert translated(limits, names).containers[0].gpu == expected


@pytest.mark.parametrize(("limits", "labels", "names", "expected"), [
    pytest.param({ALIYUN_MEM: 8}, {"aliyun.com/gpu-count": "4"}, NAMES, GpuRequest(count=4, memory_mib=2048),
                 id="cgpu-total-over-four-cards"),
    pytest.param({ALIYUN_MEM: 8}, {"aliyun.com/gpu-count": "1"}, NAMES, GpuRequest(memory_mib=8192),
                 id="cgpu-one-card"),
    pytest.param({ALIYUN_MEM: 6000}, {"aliyun.com/gpu-count": "2"}, MIB_GPUSHARE,
                 GpuRequest(count=2, memory_mib=3000), id="cgpu-mib-over-two-cards"),
])
def test_gpushare_card_count_label(limits: dict[str, Any], labels: dict[str, str], names: ResourceNames,
                                   expected: GpuRequest) -> None:
    assert translated(limits, names, labels=labels).containers[0].gpu == expected


def test_a_bare_nvidia_gpu_is_nvidias_plugin_unless_the_deployment_says_hami() -> None:
    assert not pod_wants_gpu(manifest({GPU: 1}), NAMES)
    assert translated({GPU: 1}).containers[0].gpu is None
    assert pod_wants_gpu(manifest({GPU: 1}), HAMI)
    assert pod_wants_gpu(manifest({GPU: 1, MEM: 1000}), NAMES)


@pytest.mark.parametrize(("limits", "kw", "message"), [
    pytest.param({GPU: 1, MEM: 100}, {}, "nvidia.com/gpumem=100 MiB is outside 256..", id="slice-below-256-mib"),
    pytest.param({GPU: 1, PCT: 0, MEM: 0, CORES: 101}, {}, "nvidia.com/gpucores is a percentage",
                 id="cores-above-100"),
    pytest.param({GPU: 1, PCT: 101}, {}, "nvidia.com/gpumem-percentage is a percentage", id="percentage-above-100"),
    pytest.param({GPU: 1, MEM: 1000, PRIO: 2}, {}, "nvidia.com/priority is 0 (high) or 1 (low)", id="priority-2"),
    pytest.param({GPU: 1, MEM: 1000, "gpupool.io/gpu-core": 30}, {}, "cannot be combined with gpupool.io/gpu-core",
                 id="hami-mixed-with-gpupool-names"),
    pytest.param({GPU: 300, MEM: 1000}, {}, "exceeds gpupool's bound", id="too-many-cards"),
    pytest.param({ALIYUN_MEM: 7}, {"labels": {"aliyun.com/gpu-count": "2"}}, "cannot be split evenly over 2 cards",
                 id="cgpu-total-not-divisible"),
    pytest.param({ALIYUN_MEM: 8}, {"labels": {"aliyun.com/gpu-count": "two"}}, "must be a card count",
                 id="cgpu-count-not-a-number"),
    pytest.param({}, {"init": {GPU: 1, MEM: 1000}}, "kubelet refuses an init container asking for nvidia.com/gpumem",
                 id="hami-slice-in-an-init-container"),
])
def test_foreign_manifests_gpupool_cannot_run_say_why(limits: dict[str, Any], kw: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(TranslationError, match=message.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
        translated(limits, **kw)


@pytest.mark.parametrize(("limits", "expected"), [
    pytest.param({GPU: 1, MEM: 1000, CORES: 20}, {GPU}, id="hami-names-ride-on-nvidia-gpu"),
    pytest.param({MEM: 1000}, {MEM}, id="without-nvidia-gpu-no-node-serves-it"),
    pytest.param({GPU: 2}, {GPU}, id="whole-cards"),
    pytest.param({ALIYUN_MEM: 2}, {ALIYUN_MEM}, id="gpushare"),
    pytest.param({"gpupool.io/gpu-mem": 2}, set(), id="gpupool-needs-no-alias"),
])
def test_what_a_node_must_advertise_for_the_pod(limits: dict[str, Any], expected: set[str]) -> None:
    assert foreign_resources(manifest(limits)) == frozenset(expected)


@pytest.mark.parametrize(("annotations", "expected"), [
    pytest.param({"hami.io/node-scheduler-policy": "spread"}, PolicyChoice(node="spread"), id="hami-node-spread"),
    pytest.param({"hami.io/gpu-scheduler-policy": "binpack"}, PolicyChoice(card="binpack"), id="hami-gpu-binpack"),
    pytest.param({"hami.io/gpu-scheduler-policy": "topology-aware"}, None, id="hami-topology-aware-is-the-default"),
    pytest.param({"gpupool.io/node-policy": "binpack", "gpupool.io/gpu-policy": "spread"},
                 PolicyChoice(node="binpack", card="spread"), id="gpupool-both"),
    pytest.param({"gpupool.io/node-policy": "spread", "hami.io/node-scheduler-policy": "spread"},
                 PolicyChoice(node="spread"), id="both-spellings-agreeing"),
    pytest.param({}, None, id="none"),
])
def test_per_pod_policy_annotations(annotations: dict[str, str], expected: PolicyChoice | None) -> None:
    assert translated({GPU: 1, MEM: 1000}, annotations=annotations).policy == expected


@pytest.mark.parametrize(("annotations", "expected"), [
    pytest.param({"gpupool.io/gpu-kind": "virtual"}, GpuKind.VIRTUAL, id="gpupool-virtual"),
    pytest.param({"gpupool.io/gpu-kind": "physical"}, GpuKind.PHYSICAL, id="gpupool-physical"),
    pytest.param({"nvidia.com/vgpu-mode": "mig"}, GpuKind.VIRTUAL, id="hami-mig-is-a-virtual-card"),
    pytest.param({"nvidia.com/vgpu-mode": "hami-core"}, GpuKind.PHYSICAL, id="hami-core-shares-a-physical-card"),
    pytest.param({"nvidia.com/vgpu-mode": "mig,hami-core"}, None, id="either-mode-either-kind"),
])
def test_physical_or_virtual_cards(annotations: dict[str, str], expected: GpuKind | None) -> None:
    for limits in ({GPU: 1, MEM: 1000}, {"gpupool.io/gpu-mem": 4}, {"gpupool.io/gpu": 1}):
        gpu = translated(limits, HAMI, annotations=annotations).containers[0].gpu
        assert gpu is not None and gpu.kind == expected


@pytest.mark.parametrize(("annotations", "message"), [
    pytest.param({"hami.io/node-scheduler-policy": "fastest"}, "must be one of binpack, spread", id="unknown-policy"),
    pytest.param({"gpupool.io/node-policy": "binpack", "hami.io/node-scheduler-policy": "spread"}, "disagree",
                 id="spellings-disagree"),
    pytest.param({"gpupool.io/gpu-kind": "virtual", "nvidia.com/vgpu-mode": "hami-core"}, "disagree",
                 id="kinds-disagree"),
    pytest.param({"nvidia.com/vgpu-mode": "vgpu"}, "unknown mode vgpu", id="unknown-vgpu-mode"),
])
def test_per_pod_annotations_gpupool_cannot_read_say_why(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(TranslationError, match=message):
        translated({GPU: 1, MEM: 1000}, annotations=annotations)
