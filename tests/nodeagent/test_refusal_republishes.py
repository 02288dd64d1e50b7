"""A grant refused because of a card itself (unhealthy, missing) means the extender decided from a
stale view of the node: the agent announces its cards again (its inventory is re-published), so the
replacement pod is placed on a card that works. An over-commitment is no such sign."""

from __future__ import annotations

import asyncio

import pytest

from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.allocated_codec import encode_served
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.testing.fake_node import agent_on_fake_kubelet
from gpupool.testing.memory_pod_source import InMemoryPodSource
from tests.nodeagent.harness import NAMES, fake_pod
from tests.nodeagent.test_schedule_check import CARD, Slices, mib, pod_json


def backend(second_healthy: bool) -> FakeGpuBackend:
    return FakeGpuBackend.from_dict({"model": "T4", "cards": [
        {"uuid": "GPU-0", "memoryMiB": CARD}, {"uuid": "GPU-1", "memoryMiB": CARD, "healthy": second_healthy}]})


@pytest.mark.slow
@pytest.mark.parametrize("second_healthy, pods, announced", [
    pytest.param(False, [{"main": mib(4096, card=1)}], 1, id="unhealthy-card-announced-again"),
    # both cards healthy: kubelet's device counts admit 2 x 12 GiB, only the agent sees card 0 is full
    pytest.param(True, [{"main": mib(12288)}, {"main": mib(12288)}], 0, id="over-commitment-announces-nothing"),
])
def test_a_card_refusal_announces_the_cards_again(second_healthy: bool, pods: list[Slices], announced: int) -> None:
    source = InMemoryPodSource(NAMES)
    gpus = backend(second_healthy)

    def make_agent(reader: PodResourcesClient) -> NodeAgent:
        return NodeAgent("node-a", NAMES, gpus, source, reader, encode_served, poll_s=0.05)

    async def main() -> tuple[int, int]:
        async with agent_on_fake_kubelet(make_agent) as node:
            before = node.agent.devices_version
            for i, app in enumerate(pods):
                doc = pod_json(f"p{i}", app, phase="Running")
                source.put(doc)
                await node.kubelet.handle_pod_additions([fake_pod(doc)])
                await node.kubelet.wait_idle(30)
            return node.agent.devices_version - before, node.agent.stats.refused

    changes, refused = asyncio.run(main())
    assert refused == 1
    assert changes == announced
