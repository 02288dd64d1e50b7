"""kubelet's device counts never refuse what the extender placed (the resource contract).

kubelet admits a container only when its node has as many free devices of each extended resource
as the container's limit. The extender books cards by its own rules. If a resource's devices ran
out before the extender's booking did, kubelet would refuse pods the extender had placed: that
happened when a shared slice of several cards asked for ``gpupool.io/gpu`` (one whole-card device
per card) beside its memory and compute. These tests place pods of every shape with the real
translation and the real core, and check kubelet's side two ways: by counting devices, and by
admitting the pods in the fake kubelet (real gRPC) with the node agent serving the foreign aliases.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest

from gpupool.api import names as n
from gpupool.api.annotations import Assignment, encode_assignment
from gpupool.core.cards import assign_on_node
from gpupool.core.model import GpuCard, NodeSpec, Placement
from gpupool.core.state import ClusterState
from gpupool.kube.translate import pod_request
from gpupool.nodeagent.device_layout import DeviceLayout
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.testing.node_workload import ASSIGNED_AT, WorkloadPod, fake_gpu_file
from tests.nodeagent.container_env import check_container_env
from tests.nodeagent.harness import NAMES, admit_all_running, running_node

SERVED_ALIASES = n.alias_family_resources(list(n.ALIAS_FAMILIES))
SHARED = NAMES.gpu_shared

#: Container limits as users write them: whole cards, slices of one and of several cards, tiny
#: slices (many per card: the slice-device bound), and the servable foreign aliases.
SHAPES: list[dict[str, int]] = [
    {NAMES.gpu: 1},
    {NAMES.gpu: 2},
    {SHARED: 2, NAMES.gpu_mem: 16, NAMES.gpu_core: 30},
    {SHARED: 3, NAMES.gpu_mem: 4},
    {SHARED: 2, NAMES.gpu_core: 1},
    {SHARED: 2, NAMES.gpu_core: 100},
    {NAMES.gpu_mem: 16, NAMES.gpu_core: 30},
    {NAMES.gpu_core: 1},
    {NAMES.gpu_mem: 1},
    {n.ALIYUN_GPU_MEM: 2},
    {SHARED: 2, n.ALIYUN_GPU_MEM: 1},
    {n.TENCENT_VCUDA_CORE: 20, n.TENCENT_VCUDA_MEMORY: 8},
    {n.TENCENT_VCUDA_CORE: 200},
    {n.TENCENT_VCUDA_CORE: 1},
]


def pod_json(i: int, limits: dict[str, int], spec_of_node: NodeSpec | None = None,
             placement: Placement | None = None) -> dict[str, Any]:
    """A one-container pod with ``limits`` (and its assignment once placed)."""
    annotations = {}
    if placement is not None and spec_of_node is not None:
        annotations[NAMES.assignment] = encode_assignment(Assignment.from_placement(placement, spec_of_node,
                                                                                    ASSIGNED_AT))
    return {"metadata": {"namespace": "ns", "name": f"p{i:03d}", "uid": f"uid-{i:03d}", "annotations": annotations,
                         "creationTimestamp": f"2024-01-01T00:{i // 60:02d}:{i % 60:02d}Z"},
            "spec": {"nodeName": "node-a", "containers": [
                {"name": "main", "resources": {"limits": {k: str(v) for k, v in limits.items()}}}]},
            "status": {"phase": "Pending"}}


def fill(gpu_file: dict[str, Any], shapes: list[dict[str, int]], rng: random.Random,
         tries: int) -> tuple[NodeSpec, list[tuple[dict[str, Any], Placement]]]:
    """Pods of random shapes placed by the core on one node until ``tries`` attempts are spent."""
    cards = tuple(GpuCard(index=i, uuid=c["uuid"], model=gpu_file["model"], memory_mib=c["memoryMiB"])
                  for i, c in enumerate(gpu_file["cards"]))
    spec = NodeSpec("node-a", cpu_milli=10**7, memory_mib=10**8, cards=cards)
    state = ClusterState([spec], max_cards=len(cards))
    placed = []
    for i in range(tries):
        limits = rng.choice(shapes)
        request = pod_request(pod_json(i, limits), NAMES)
        placement = assign_on_node(state, 0, request)
        if isinstance(placement, str):
            continue
        state.apply(placement)
        placed.append((pod_json(i, limits, spec, placement), placement))
    return spec, placed


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_kubelet_device_counts_cover_every_booking(seed: int) -> None:
    """Per resource, the devices the node advertises are at least the sum of the limits of every
    pod the core could place: kubelet's count admission never binds before the extender's."""
    gpu_file = fake_gpu_file(3, memory_mib=16384)
    rng = random.Random(seed)
    shapes = [*rng.sample(SHAPES, 6), {SHARED: 2, NAMES.gpu_core: 1}, {NAMES.gpu_mem: 1}]
    _, placed = fill(gpu_file, shapes, rng, tries=600)
    assert len(placed) >= 10

    inventory = FakeGpuBackend.from_dict(gpu_file).inventory()
    layout = DeviceLayout(NAMES)
    wanted: Counter[str] = Counter()
    for pod, _ in placed:
        for name, value in pod["spec"]["containers"][0]["resources"]["limits"].items():
            wanted[name] += int(value)
    for resource, total in wanted.items():
        advertised = len(layout.devices(resource, inventory))
        assert total <= advertised, f"{resource}: pods need {total} devices, the node has {advertised}"


@pytest.mark.slow
def test_two_shared_multi_card_pods_and_aliases_are_admitted_with_their_cards() -> None:
    """A whole card, two slices that each span the other two cards, and the foreign aliases: the
    fake kubelet (kubelet 1.20's device manager) admits them all and each container's env is its
    assignment. With ``gpu: 2`` in place of ``gpu-shared: 2`` the second slice would find no free
    whole-card device and be refused."""
    gpu_file = fake_gpu_file(3, memory_mib=16384)
    shapes = [{NAMES.gpu: 1},
              {SHARED: 2, NAMES.gpu_mem: 16, NAMES.gpu_core: 30},
              {SHARED: 2, NAMES.gpu_mem: 16, NAMES.gpu_core: 30},
              {n.ALIYUN_GPU_MEM: 2},
              {n.TENCENT_VCUDA_CORE: 20, n.TENCENT_VCUDA_MEMORY: 8},
              {SHARED: 2, n.ALIYUN_GPU_MEM: 1}]

    class InOrder(random.Random):
        def choice(self, seq: Any) -> Any:
            return shapes.pop(0)

    _, placed = fill(gpu_file, list(shapes), InOrder(), tries=len(shapes))
    assert len(placed) == 6
    whole = placed[0][1].containers[0].slices[0].card
    assert all(s.card != whole for _, p in placed[1:] for s in p.containers[0].slices)
    assert [len(p.containers[0].slices) for _, p in placed] == [1, 2, 2, 1, 1, 2]
    uuids = {i: c["uuid"] for i, c in enumerate(gpu_file["cards"])}

    async def main() -> None:
        async with running_node(gpu_file, [p for p, _ in placed], aliases=SERVED_ALIASES) as node:
            k = node.kubelet
            assert sorted(k.endpoints) == sorted((*NAMES.all(), *SERVED_ALIASES))
            assert k.allocatable(n.ALIYUN_GPU_MEM) == 3 * 16
            assert k.allocatable(n.TENCENT_VCUDA_MEMORY) == 3 * 64
            assert k.allocatable(SHARED) == 3 * (64 + 100)
            fakes = await admit_all_running(k, (pod for pod, _ in placed))

            for pod, placement in placed:
                wp = WorkloadPod(json=pod, placement=placement)
                assert check_container_env(wp, fakes[wp.key], uuids) == 1
            assert node.agent.stats.refused == 0
    asyncio.run(main())
