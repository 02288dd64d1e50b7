"""MIG instances published as virtual cards, as the extender books them: a pod asking
``gpupool.io/gpu-kind: virtual`` gets a MIG instance and a ``physical`` pod never does, whatever is
free; a slice on a MIG instance is held to the instance's compute (its slices of the card)."""

from __future__ import annotations

from typing import Any

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.core.model import GpuCard, GpuKind, Placement
from gpupool.extender.cache import ClusterCache
from gpupool.kube.translate import pod_request
from tests.kube.builders import container, node, pod

KIND = "gpupool.io/gpu-kind"
UUIDS = ("MIG-a", "MIG-b", "GPU-whole")


def mig_node(name: str) -> dict[str, Any]:
    """Card 0 of an H200 cut into 3g.71gb and 2g.35gb (MIG devices 0 and 1), card 1 a whole H200."""
    cards = (GpuCard(0, "MIG-a", "NVIDIA-H200", 71424, compute=428, kind=GpuKind.VIRTUAL, profile="3g.71gb",
                     parent="GPU-parent"),
             GpuCard(1, "MIG-b", "NVIDIA-H200", 35584, compute=285, kind=GpuKind.VIRTUAL, profile="2g.35gb",
                     parent="GPU-parent"),
             GpuCard(2, "GPU-whole", "NVIDIA-H200", 143771))
    doc = node(name)
    doc["metadata"]["annotations"]["gpupool.io/inventory-v1"] = encode_inventory(Inventory(cards))
    return doc


def cache_with_mig_node() -> ClusterCache:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([mig_node("n")])
    return cache


def cards_of(decision: Any) -> list[str]:
    assert isinstance(decision, Placement), decision
    return [UUIDS[s.card] for c in decision.containers for s in c.slices]


def reserve(cache: ClusterCache, name: str, kind: str | None, **limits: int) -> Any:
    annotations = {KIND: kind} if kind else {}
    request = pod_request(pod(name, container("main", **limits), annotations=annotations), cache.names)
    return cache.reserve(request, "n")


def test_virtual_pods_get_mig_instances_and_physical_pods_never_do() -> None:
    cache = cache_with_mig_node()
    first, second = reserve(cache, "v1", "virtual", gpu=1), reserve(cache, "v2", "virtual", gpu=1)
    assert sorted(cards_of(first) + cards_of(second)) == ["MIG-a", "MIG-b"]
    assert not isinstance(reserve(cache, "v3", "virtual", gpu=1), Placement)  # the physical card is not one
    assert cards_of(reserve(cache, "p1", "physical", gpu=1)) == ["GPU-whole"]


def test_a_physical_pod_is_refused_while_only_mig_instances_are_free() -> None:
    cache = cache_with_mig_node()
    assert cards_of(reserve(cache, "p1", "physical", gpu=1)) == ["GPU-whole"]
    refused = reserve(cache, "p2", "physical", gpu=1)
    assert not isinstance(refused, Placement), refused
    assert sorted(cards_of(reserve(cache, "v1", "virtual", gpu=1)) + cards_of(reserve(cache, "v2", "virtual", gpu=1))) \
        == ["MIG-a", "MIG-b"]  # the instances were free all along


def test_a_slice_of_a_mig_instance_is_held_to_the_instances_compute() -> None:
    """3g.71gb offers 428 per-mille, 2g.35gb 285: a 30 % slice fits only the first, and only once
    (the whole card would have room, but it is not virtual)."""
    cache = cache_with_mig_node()
    assert cards_of(reserve(cache, "s1", "virtual", gpu_core=30, gpu_mem=4)) == ["MIG-a"]
    refused = reserve(cache, "s2", "virtual", gpu_core=30, gpu_mem=4)
    assert not isinstance(refused, Placement) and "30 percent compute" in refused.reason
    assert cards_of(reserve(cache, "s3", "virtual", gpu_core=20, gpu_mem=4)) == ["MIG-b"]
