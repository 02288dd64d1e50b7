"""The device plugin against a fake kubelet speaking the real gRPC protocol."""

from __future__ import annotations

import asyncio
import os

import pytest

from gpupool.nodeagent.deviceplugin.api import pb
from gpupool.nodeagent.gpu_inventory import HealthEvent
from gpupool.testing.node_workload import fake_gpu_file, generate
from tests.nodeagent.harness import NAMES, fake_pod, running_node


@pytest.mark.slow
def test_registers_all_resources_with_unit_counts() -> None:
    async def main() -> None:
        async with running_node(fake_gpu_file(4, memory_mib=81920)) as node:
            k = node.kubelet
            assert sorted(k.endpoints) == sorted(NAMES.all())
            assert k.allocatable(NAMES.gpu) == 4
            assert k.allocatable(NAMES.gpu_mem) == 4 * 81920 // 256
            assert k.allocatable(NAMES.gpu_core) == 400
            # one device per slice: more per card than a card can hold (memory units + 100)
            assert k.allocatable(NAMES.gpu_shared) == 4 * (81920 // 256 + 100)
            for ep in k.endpoints.values():
                assert ep.options.pre_start_required and ep.options.get_preferred_allocation_available
    asyncio.run(main())


@pytest.mark.slow
def test_list_and_watch_for_eight_141gb_cards_is_under_1mb() -> None:
    async def main() -> None:
        async with running_node(fake_gpu_file(8, memory_mib=144384, model="NVIDIA-H200")) as node:
            devices = node.agent.device_list(NAMES.gpu_mem)
            size = pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Healthy") for i, _ in devices]
                                           ).ByteSize()
            assert len(devices) == 8 * 564
            assert size < 1_000_000, size
            assert node.kubelet.allocatable(NAMES.gpu_mem) == 8 * 564
            slices = node.agent.device_list(NAMES.gpu_shared)
            size = pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Healthy") for i, _ in slices]
                                           ).ByteSize()
            assert len(slices) == 8 * (564 + 100) and size < 1_000_000, size
    asyncio.run(main())


@pytest.mark.slow
def test_health_change_and_recovery_reach_kubelet() -> None:
    async def main() -> None:
        async with running_node(fake_gpu_file(4)) as node:
            k = node.kubelet
            node.backend.inject(HealthEvent(2, False, "XID 79"))
            for _ in range(100):
                if k.allocatable(NAMES.gpu) == 3:
                    break
                await asyncio.sleep(0.02)
            assert k.allocatable(NAMES.gpu) == 3
            assert "g2" in k.endpoints[NAMES.gpu].unhealthy
            assert k.allocatable(NAMES.gpu_core) == 300
            node.backend.inject(HealthEvent(2, True, "recovered"))
            for _ in range(100):
                if k.allocatable(NAMES.gpu) == 4:
                    break
                await asyncio.sleep(0.02)
            assert k.allocatable(NAMES.gpu) == 4
    asyncio.run(main())


@pytest.mark.slow
def test_scripted_xid_from_fake_file() -> None:
    # The card recovers 1.3 s after its XID 79: the plugin sends kubelet the devices' state when it
    # changed, so a spell shorter than a stall of the agent's loop may never reach kubelet, which is
    # allowed (kubelet needs the current state); the test reads every reply kubelet got.
    gpu_file = fake_gpu_file(2)
    gpu_file["events"] = [{"at": 0.1, "card": 1, "xid": 13}, {"at": 0.2, "card": 1, "xid": 79},
                          {"at": 1.5, "card": 1, "recover": True}]

    async def main() -> None:
        async with running_node(gpu_file) as node:
            counts = node.kubelet.endpoints[NAMES.gpu].healthy_counts
            for _ in range(1000):
                if 1 in counts and counts[-1] == 2:
                    break
                await asyncio.sleep(0.01)
            assert 1 in counts, f"XID 79 must mark the card unhealthy (XID 13 is an application error): {counts}"
            assert min(counts) == 1 and counts[-1] == 2, counts
    asyncio.run(main())


@pytest.mark.slow
def test_kubelet_restart_reregisters_within_seconds() -> None:
    _, pods = generate(10, cards=4, seed=3)

    async def main() -> None:
        async with running_node(fake_gpu_file(4), [p.json for p in pods]) as node:
            k = node.kubelet
            await k.handle_pod_additions([fake_pod(p.json) for p in pods[:5]])
            await k.wait_idle()
            before = {ep.resource: os.stat(ep.socket).st_ctime_ns for ep in k.endpoints.values()}
            await k.restart()
            loop = asyncio.get_running_loop()
            start = loop.time()
            await k.wait_registered(len(NAMES.all()), count=2, timeout=5)
            assert loop.time() - start < 3.0
            # The restart wiped the plugin dir; every socket kubelet now dials is a new file the
            # plugin created after noticing (the plugin may do so before restart() even returns,
            # so the wiped dir itself is not observable here without a race).
            after = {ep.resource: os.stat(ep.socket).st_ctime_ns for ep in k.endpoints.values()}
            assert after.keys() == before.keys()
            assert all(after[r] > before[r] for r in before), (before, after)
            assert k.allocatable(NAMES.gpu) == 4
            # The re-registered plugin still serves the pods admitted right after the restart,
            # although its PodResources channel failed while kubelet was away (found with a real
            # kubelet: the channel's reconnect backoff refused the first Allocate).
            await k.handle_pod_additions([fake_pod(p.json) for p in pods[5:]])
            await k.wait_idle()
            assert all(p.phase == "Running" for p in k.pod_manager.values()), \
                [(p.name, p.reason) for p in k.pod_manager.values()]
            assert node.agent.stats.refused == 0
    asyncio.run(main())
