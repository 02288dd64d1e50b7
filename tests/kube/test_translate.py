"""Pod and node JSON → core requests and node specs, including aliases and every rejection."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import V1Container, V1ObjectMeta, V1Pod, V1PodSpec, V1ResourceRequirements

from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuRequest
from gpupool.kube.translate import InvalidObjectError, TranslationError, node_spec, pod_request, pod_wants_gpu
from tests.kube.builders import container, node, pod

NAMES = ResourceNames()


def gpu_of(c: dict[str, Any], annotations: dict[str, str] | None = None) -> GpuRequest | None:
    return pod_request(pod("p", c, annotations=annotations), NAMES).containers[0].gpu


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        # 256 MiB units
        pytest.param({"gpu_mem": 32}, GpuRequest(count=1, compute=0, memory_mib=8192), id="memory-units"),
        pytest.param({"gpu_core": 30}, GpuRequest(count=1, compute=300, memory_mib=None), id="compute-percent"),
        pytest.param(
            {"gpu_core": 30, "gpu_mem": 16}, GpuRequest(count=1, compute=300, memory_mib=4096),
            id="compute-and-memory",
        ),
        # per card
        pytest.param(
            {"gpu_shared": 2, "gpu_mem": 16}, GpuRequest(count=2, compute=0, memory_mib=4096),
            id="shared-memory-per-card",
        ),
        pytest.param(
            {"gpu_shared": 2, "gpu_mem": 16, "gpu_core": 30}, GpuRequest(count=2, compute=300, memory_mib=4096),
            id="shared-memory-and-compute",
        ),
        pytest.param({"gpu_shared": 2, "gpu_core": 100}, GpuRequest.whole(2), id="shared-full-compute-is-whole"),
        pytest.param(
            {"gpu_shared": 2, "aliyun.com/gpu-mem": 3}, GpuRequest(count=2, compute=0, memory_mib=3072),
            id="shared-aliyun-memory",
        ),
        pytest.param({"gpu": 2}, GpuRequest.whole(2), id="whole-cards"),
        pytest.param({"gpu_core": 100}, GpuRequest.whole(1), id="full-compute-is-whole"),
        pytest.param({"aliyun.com/gpu-mem": 4}, GpuRequest(compute=0, memory_mib=4096), id="aliyun-memory"),
        pytest.param(
            {"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 8},
            GpuRequest(compute=500, memory_mib=2048), id="tencent-vcuda"),
        pytest.param({"tencent.com/vcuda-core": 200}, GpuRequest.whole(2), id="tencent-vcuda-whole-cards"),
        pytest.param(
            {"nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 25}, GpuRequest(compute=250, memory_mib=3000),
            id="hami-gpumem-gpucores",
        ),
    ],
)
def test_container_requests(limits: dict[str, int], expected: GpuRequest) -> None:
    c = {
        "name": "main",
        "resources": {
            "limits": {
                {
                    "gpu": "gpupool.io/gpu",
                    "gpu_mem": "gpupool.io/gpu-mem",
                    "gpu_core": "gpupool.io/gpu-core",
                    "gpu_shared": "gpupool.io/gpu-shared",
                }.get(k, k): str(v)
                for k, v in limits.items()
            }
        },
    }
    assert gpu_of(c) == expected


def test_requests_only_and_equal_requests_and_limits() -> None:
    c = {"name": "main", "resources": {"requests": {"gpupool.io/gpu-mem": "100"}}}
    assert gpu_of(c) == GpuRequest(compute=0, memory_mib=25600)
    c = {
        "name": "main",
        "resources": {"requests": {"gpupool.io/gpu-mem": "100"}, "limits": {"gpupool.io/gpu-mem": "100"}},
    }
    assert gpu_of(c) == GpuRequest(compute=0, memory_mib=25600)


def test_annotations_models_and_exclusive() -> None:
    gpu = gpu_of(
        container(gpu_mem=100), {"gpupool.io/gpu-models": "A100, V100", "gpupool.io/exclusive": "true"}
    )
    assert gpu == GpuRequest.whole(1, frozenset({"A100", "V100"}))


def test_multi_container_init_and_sidecar() -> None:
    p = pod(
        "p",
        container("a", gpu_mem=100, cpu="500m", memory="1Gi"),
        container("b", cpu="1"),
        init=[container("init", gpu_core=50), {**container("side", gpu_mem=10), "restartPolicy": "Always"}],
    )
    request = pod_request(p, NAMES)
    assert [c.name for c in request.containers] == ["a", "b", "side"]
    assert [c.name for c in request.init_containers] == ["init"]
    assert request.containers[0].cpu_milli == 500 and request.containers[0].memory_mib == 1024
    assert request.cpu_milli == 1500
    assert request.key == "default/p"
    assert request.wants_gpu


def test_pod_without_gpu() -> None:
    p = pod("p", container(cpu="1"))
    assert not pod_wants_gpu(p, NAMES)
    assert not pod_request(p, NAMES).wants_gpu


def test_custom_domain() -> None:
    names = ResourceNames("example.com")
    c = {"name": "main", "resources": {"limits": {"example.com/gpu-mem": "5"}}}
    assert pod_request(pod("p", c), names).containers[0].gpu == GpuRequest(compute=0, memory_mib=5 * 256)
    assert pod_request(pod("p", container(gpu_mem=5)), names).containers[0].gpu is None


@pytest.mark.parametrize(
    ("c", "annotations", "fragment"),
    [
        pytest.param(container(gpu_mem="1.5"), None, "must be a whole number", id="fractional-memory"),
        pytest.param(container(gpu_mem="lots"), None, "not a Kubernetes quantity", id="unreadable-quantity"),
        pytest.param(container(gpu_core=150), None, "percentage of one card", id="compute-over-a-card"),
        pytest.param(
            container(gpu_mem=10, **{"aliyun.com/gpu-mem": 1}), None, "GPU memory given twice",
            id="memory-given-twice",
        ),
        pytest.param(
            {
                "name": "main",
                "resources": {"requests": {"gpupool.io/gpu-mem": "1"}, "limits": {"gpupool.io/gpu-mem": "2"}},
            },
            None,
            "request == limit", id="request-differs-from-limit"),
        pytest.param(
            container(gpu_mem=10), {"gpupool.io/exclusive": "yes"}, 'must be "true" or "false"',
            id="exclusive-not-boolean",
        ),
        pytest.param(
            {"name": "main", "resources": {"limits": ["gpu"]}}, None, "expected an object",
            id="limits-not-an-object",
        ),
        pytest.param({"resources": {}}, None, "has no name", id="container-without-name"),
        # gpu counts whole exclusive cards: with a slice kubelet would take whole-card devices
        pytest.param(
            container(gpu=2, gpu_mem=16), None, "write gpupool.io/gpu-shared: 2",
            id="whole-cards-with-memory",
        ),
        pytest.param(
            container(gpu=1, gpu_core=30), None, "cannot be combined with gpupool.io/gpu-core",
            id="whole-cards-with-compute",
        ),
        pytest.param(
            container(gpu=1, **{"tencent.com/vcuda-core": 100}), None, "whole exclusive cards",
            id="whole-cards-with-vcuda-core",
        ),
        pytest.param(
            container(**{"gpupool.io/gpu-shared": 2}), None, "add gpupool.io/gpu-mem and/or gpupool.io/gpu-core",
            id="shared-without-amounts",
        ),
        pytest.param(
            container(**{"gpupool.io/gpu-shared": 3, "tencent.com/vcuda-core": 200}), None, "means 2 cards",
            id="shared-count-disagrees-with-vcuda",
        ),
    ],
)
def test_rejections(c: dict[str, Any], annotations: dict[str, str] | None, fragment: str) -> None:
    with pytest.raises(TranslationError, match=fragment):
        pod_request(pod("p", c, annotations=annotations), NAMES)


def test_duplicate_container_names() -> None:
    with pytest.raises(TranslationError, match="appears twice"):
        pod_request(pod("p", container("a", gpu_mem=1), container("a", gpu_mem=1)), NAMES)


def test_v1pod_model_is_accepted() -> None:
    model = V1Pod(
        metadata=V1ObjectMeta(name="m", namespace="x"),
        spec=V1PodSpec(
            containers=[
                V1Container(
                    name="main", resources=V1ResourceRequirements(limits={"gpupool.io/gpu-mem": "64"})
                )
            ]
        ),
    )
    request = pod_request(model, NAMES)
    assert request.key == "x/m"
    assert request.containers[0].gpu == GpuRequest(compute=0, memory_mib=64 * 256)


def test_node_from_inventory() -> None:
    spec = node_spec(node("n1", [16276, 8000], model="T4"), NAMES)
    assert [(c.index, c.memory_mib, c.model) for c in spec.cards] == [(0, 16276, "T4"), (1, 8000, "T4")]
    assert spec.cpu_milli == 32000 and spec.memory_mib == 128 * 1024


def test_node_fallback_splits_capacity_evenly() -> None:
    # The device plugin advertises memory in 256 MiB devices: 2 x 16,384 MiB = 128 devices.
    raw = node("n2", capacity={"gpupool.io/gpu": "2", "gpupool.io/gpu-mem": "128"})
    raw["metadata"]["labels"]["nvidia.com/gpu.product"] = "Tesla-P100"
    spec = node_spec(raw, NAMES)
    assert [(c.uuid, c.memory_mib, c.model) for c in spec.cards] == [
        ("n2-gpu0", 16384, "Tesla-P100"),
        ("n2-gpu1", 16384, "Tesla-P100"),
    ]
    assert node_spec(node("plain"), NAMES).cards == ()


def test_node_with_broken_inventory() -> None:
    with pytest.raises(TranslationError, match="node bad: inventory-v1"):
        node_spec(node("bad", annotations={"gpupool.io/inventory-v1": "{"}), NAMES)


@pytest.mark.parametrize(
    ("c", "fragment"),
    [
        pytest.param(container(cpu="inf"), "cpu='inf' is not a Kubernetes quantity", id="cpu-inf"),
        pytest.param(container(memory="NaN"), "memory='NaN' is not a Kubernetes quantity", id="memory-nan"),
        pytest.param(container(gpu_mem="9" * 3000), "gpupool.io/gpu-mem='99999999999", id="3000-digit-gpu-mem"),
        pytest.param(container(mib="1e999999999"), "beyond the Kubernetes quantity range", id="huge-exponent"),
        pytest.param({"name": "main\nforged", "resources": {}}, "container name 'main\\\\nforged'",
                     id="container-name-with-newline"),
        pytest.param(container(gpu_mem="lots"), "not a Kubernetes quantity", id="not-a-quantity"),
    ],
)
def test_values_the_apiserver_refuses_are_invalid_objects(c: dict[str, Any], fragment: str) -> None:
    """InvalidObjectError: the extender answers these 400 (the pod never came from a cluster)."""
    with pytest.raises(InvalidObjectError, match=fragment):
        pod_request(pod("p", c), NAMES)


@pytest.mark.parametrize("field", [pytest.param("name", id="name"), pytest.param("namespace", id="namespace")])
def test_a_pod_name_with_control_characters_is_an_invalid_object(field: str) -> None:
    """Pod names reach log lines and events; the apiserver allows DNS names only."""
    p = pod("p", container(cpu="1"))
    p["metadata"][field] = "p\x1b[31m"
    with pytest.raises(InvalidObjectError, match=rf"pod\.metadata\.{field} 'p\\x1b\[31m': must not contain control"):
        pod_request(p, NAMES)


def test_a_priority_past_int32_is_an_invalid_object() -> None:
    p = pod("p", container(cpu="1"))
    p["spec"]["priority"] = 1 << 40
    with pytest.raises(InvalidObjectError, match=r"spec\.priority must be a 32-bit integer"):
        pod_request(p, NAMES)


@pytest.mark.parametrize(
    ("c", "fragment"),
    [
        pytest.param(container(cpu="9e15"), r"cpu \(milli\)=9000000000000000000 exceeds gpupool's bound",
                     id="cpu-past-the-ledger"),
        pytest.param(container(memory="4Pi"), r"memory \(MiB\)=4294967296 exceeds", id="memory-past-the-ledger"),
        pytest.param(container(gpu=65), r"gpupool.io/gpu=65 exceeds gpupool's bound for one node \(at most 64\)",
                     id="too-many-whole-cards"),
        pytest.param(container(gpu_mem=16, **{"gpupool.io/gpu-shared": 100}), "gpupool.io/gpu-shared=100 exceeds",
                     id="slice-of-too-many-cards"),
        pytest.param(container(gpu_mem=4097), r"gpupool.io/gpu-mem counts 256 MiB units: 4097 is 1 TiB",
                     id="slice-past-1TiB"),
        pytest.param(container(**{"tencent.com/vcuda-core": 10000}), r"vcuda-core \(whole cards\)=100 exceeds",
                     id="vcuda-whole-cards"),
    ],
)
def test_values_past_gpupool_bounds_are_a_pod_error(c: dict[str, Any], fragment: str) -> None:
    """Valid Kubernetes, but past what any node can have: a pod-level reason, never an overflow."""
    with pytest.raises(TranslationError, match=fragment) as refused:
        pod_request(pod("p", c), NAMES)
    assert not isinstance(refused.value, InvalidObjectError)


@pytest.mark.parametrize(
    ("capacity", "fragment"),
    [
        pytest.param({"cpu": "9e15"}, r"cpu \(milli\)=9000000000000000000 exceeds", id="cpu"),
        pytest.param({"memory": "inf"}, "memory='inf' is not a Kubernetes quantity", id="memory-inf"),
        pytest.param({"gpupool.io/gpu": "1e9"}, "gpupool.io/gpu=1000000000 exceeds", id="a-billion-fallback-cards"),
        pytest.param({"gpupool.io/gpu": "1", "gpupool.io/gpu-mem": "1e15"}, r"GPU memory per card \(MiB\)=",
                     id="fallback-card-memory"),
    ],
)
def test_node_values_past_the_bounds_are_the_node_reason(capacity: dict[str, str], fragment: str) -> None:
    """The cache keeps such a node without cards and reports this reason (no ledger overflow, no
    billion-card tuple)."""
    raw = node("big", capacity=capacity)
    with pytest.raises(TranslationError, match=fragment):
        node_spec(raw, NAMES)


def test_node_with_a_31_digit_card_is_refused_by_name() -> None:
    inventory = ('{"v": 1, "cards": [{"index": 0, "uuid": "GPU-a", "model": "T4", '
                 '"memoryMiB": 1000000000000000000000000000000, "healthy": true}]}')
    with pytest.raises(TranslationError, match=r"node big: inventory-v1.cards\[0\].memoryMiB: at most 1048576 MiB"):
        node_spec(node("big", annotations={"gpupool.io/inventory-v1": inventory}), NAMES)
