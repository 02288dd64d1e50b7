"""The node agent serving HAMi's and gpushare's names (``--serve-aliases hami,gpushare``).

kubelet sees only HAMi's card count ``nvidia.com/gpu``; HAMi's memory and compute names are not
kubelet devices and are dropped from an app container's admission, as under HAMi. So the rule of
the resource contract (docs/node-agent.md) is about ``nvidia.com/gpu`` alone: every HAMi pod the
core can place takes one device per card it spans, and a card must offer at least as many devices as
HAMi slices fit on it. Checked by counting and by admitting HAMi pods in the fake kubelet.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from gpupool.api import names as n
from gpupool.api.annotations import Assignment, encode_assignment
from gpupool.api.names import ResourceNames
from gpupool.core.cards import assign_on_node
from gpupool.core.model import GpuCard, NodeSpec, Placement
from gpupool.core.state import ClusterState
from gpupool.kube.translate import pod_request
from gpupool.nodeagent.device_layout import DeviceLayout, list_and_watch_problem
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.testing.node_workload import ASSIGNED_AT, WorkloadPod, fake_gpu_file
from tests.nodeagent.container_env import check_container_env
from tests.nodeagent.harness import admit_all_running, running_node

# Slow, so scripts/test-all runs it and a plain pytest does not: every HAMi slice the core places, admitted through a
# running node per case.
pytestmark = pytest.mark.slow

HAMI = ResourceNames(hami=True)
GPU, MEM, PCT, CORES = n.NVIDIA_GPU, n.NVIDIA_GPUMEM, n.NVIDIA_GPUMEM_PERCENTAGE, n.NVIDIA_GPUCORES

#: The HAMi shapes that put the most slices on a card: the smallest memory slice, the smallest
#: memory share, compute-only slices (which take the whole memory), over one and two cards.
TINY: list[dict[str, int]] = [{GPU: 1, MEM: 256}, {GPU: 1, PCT: 1}, {GPU: 2, PCT: 1}, {GPU: 2, MEM: 256},
                              {GPU: 1, PCT: 1, CORES: 1}, {GPU: 1, MEM: 300, CORES: 5}]


def pod_json(i: int, limits: dict[str, int], spec: NodeSpec | None = None,
             placement: Placement | None = None) -> dict[str, Any]:
    annotations = {}
    if placement is not None and spec is not None:
        annotations[HAMI.assignment] = encode_assignment(Assignment.from_placement(placement, spec, ASSIGNED_AT))
    return {"metadata": {"namespace": "ns", "name": f"h{i:03d}", "uid": f"uid-h{i:03d}", "annotations": annotations,
                         "creationTimestamp": f"2024-01-01T00:{i // 60:02d}:{i % 60:02d}Z"},
            "spec": {"nodeName": "node-a", "containers": [
                {"name": "main", "resources": {"limits": {k: str(v) for k, v in limits.items()}}}]},
            "status": {"phase": "Pending"}}


def fill(card_mib: list[int], shapes: list[dict[str, int]], rng: random.Random, tries: int,
         uuids: list[str] | None = None) -> tuple[NodeSpec, list[tuple[dict[str, Any], Placement]]]:
    cards = tuple(GpuCard(i, uuids[i] if uuids else f"GPU-{i}", "T4", m) for i, m in enumerate(card_mib))
    spec = NodeSpec("node-a", cpu_milli=10**7, memory_mib=10**8, cards=cards)
    state = ClusterState([spec], max_cards=len(cards))
    placed = []
    for i in range(tries):
        limits = rng.choice(shapes)
        placement = assign_on_node(state, 0, pod_request(pod_json(i, limits), HAMI))
        if isinstance(placement, Placement):
            state.apply(placement)
            placed.append((pod_json(i, limits, spec, placement), placement))
    return spec, placed


@pytest.mark.parametrize("card_mib", [
    pytest.param([16_276, 16_276], id="v100-16276"),
    pytest.param([16_384, 81_920], id="t4-and-a100"),
    pytest.param([4_000], id="small-card-where-1-percent-is-below-256-mib"),
    pytest.param([143_771], id="h200"),
])
@pytest.mark.parametrize("seed", range(3))
def test_nvidia_gpu_devices_cover_every_hami_slice_the_core_places(card_mib: list[int], seed: int) -> None:
    """Fill the node with the smallest HAMi slices until nothing fits; per card, the slices placed
    never outnumber its nvidia.com/gpu devices (kubelet's count never refuses the extender)."""
    rng = random.Random(seed)
    _, placed = fill(card_mib, TINY, rng, tries=3000)
    layout = DeviceLayout(HAMI)
    per_card: dict[int, int] = {}
    for _, placement in placed:
        for s in placement.containers[0].slices:
            per_card[s.card] = per_card.get(s.card, 0) + 1
    assert sum(per_card.values()) >= 10 * len(card_mib)
    for card, slices in per_card.items():
        devices = len(layout.card_ids(GPU, card, card_mib[card]))
        assert slices <= devices, f"card {card}: {slices} HAMi slices, {devices} devices"
    kubelet_takes = sum(int(p["spec"]["containers"][0]["resources"]["limits"][GPU]) for p, _ in placed)
    assert kubelet_takes == sum(per_card.values())


@pytest.mark.parametrize(("names", "resource", "card_mib", "ids"), [
    pytest.param(HAMI, GPU, 16_384, 64 + 200, id="hami-card-count"),
    pytest.param(ResourceNames(), n.ALIYUN_GPU_MEM, 16_384, 16, id="gpushare-gib"),
    pytest.param(ResourceNames(gpushare_unit_mib=1), n.ALIYUN_GPU_MEM, 16_384, 16_384, id="gpushare-mib"),
])
def test_devices_per_card(names: ResourceNames, resource: str, card_mib: int, ids: int) -> None:
    found = DeviceLayout(names).card_ids(resource, 3, card_mib)
    assert len(found) == ids and len(set(found)) == ids
    assert {DeviceLayout.card_of(d) for d in found} == {3}


@pytest.mark.parametrize(("names", "resource", "card_mib", "cards", "refused"), [
    pytest.param(ResourceNames(gpushare_unit_mib=1), n.ALIYUN_GPU_MEM, 81_920, 8, True, id="mib-8x80gb"),
    pytest.param(ResourceNames(gpushare_unit_mib=1), n.ALIYUN_GPU_MEM, 16_384, 4, False, id="mib-4x16gb"),
    pytest.param(ResourceNames(), n.ALIYUN_GPU_MEM, 143_771, 8, False, id="gib-8xh200"),
    pytest.param(HAMI, GPU, 143_771, 8, False, id="hami-8xh200"),
])
def test_a_device_list_kubelet_cannot_read_is_refused_at_start(names: ResourceNames, resource: str, card_mib: int,
                                                               cards: int, refused: bool) -> None:
    inventory = FakeGpuBackend.from_dict(fake_gpu_file(cards, memory_mib=card_mib)).inventory()
    problem = list_and_watch_problem(DeviceLayout(names), resource, inventory)
    assert (problem is not None) == refused
    if refused:
        assert problem is not None and "more than kubelet reads in one message" in problem


def test_hami_pods_are_admitted_with_their_cards_through_nvidia_gpu() -> None:
    """Whole cards, a MiB slice with cores, a percentage slice over two cards and a cores-only
    slice: the fake kubelet (kubelet 1.20's device manager, unadvertised names dropped from app
    containers) calls Allocate for nvidia.com/gpu only, and each container's env is its assignment."""
    gpu_file = fake_gpu_file(4, memory_mib=16384)
    shapes = [{GPU: 1}, {GPU: 1, CORES: 20}, {GPU: 1, MEM: 3000, CORES: 30},
              {GPU: 2, PCT: 25, n.NVIDIA_PRIORITY: 1}, {GPU: 1, MEM: 3000, CORES: 30}]

    class InOrder(random.Random):
        def choice(self, seq: Any) -> Any:
            return shapes.pop(0)

    card_mib = [c["memoryMiB"] for c in gpu_file["cards"]]
    uuids = {i: c["uuid"] for i, c in enumerate(gpu_file["cards"])}
    _, placed = fill(card_mib, list(shapes), InOrder(), tries=len(shapes), uuids=list(uuids.values()))
    assert [len(p.containers[0].slices) for _, p in placed] == [1, 1, 1, 2, 1]

    async def main() -> None:
        async with running_node(gpu_file, [p for p, _ in placed], aliases=(GPU,), names=HAMI) as node:
            k = node.kubelet
            assert k.allocatable(GPU) == 4 * (64 + 200)
            fakes = await admit_all_running(k, (pod for pod, _ in placed))
            for pod, placement in placed:
                wp = WorkloadPod(json=pod, placement=placement)
                assert check_container_env(wp, fakes[wp.key], uuids) == 1
                assert {r for (uid, _c, r) in k.pod_devices if uid == pod["metadata"]["uid"]} == {GPU}
            assert node.agent.stats.refused == 0
    asyncio.run(main())
