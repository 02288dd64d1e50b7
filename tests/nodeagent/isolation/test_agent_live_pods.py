"""What the agent tells its enforcement backend about live pods: nothing until it knows."""

from __future__ import annotations

import asyncio

from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.allocated_codec import encode_served
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.types import PodResourcesSnapshot
from gpupool.testing.memory_pod_source import InMemoryPodSource
from gpupool.testing.node_workload import generate
from tests.nodeagent.harness import NAMES


class Listing:
    """A PodResources reader answering whatever the test sets."""

    def __init__(self) -> None:
        self.snapshot: PodResourcesSnapshot = {}

    async def list(self) -> PodResourcesSnapshot:
        return self.snapshot


def test_live_pods_is_unknown_before_the_first_listing_and_while_a_listed_pod_is_unreadable() -> None:
    gpu_file, pods = generate(2, cards=2, seed=1)
    source = InMemoryPodSource(NAMES)
    for p in pods:
        source.put(p.json)
    listing = Listing()
    agent = NodeAgent("node-a", NAMES, FakeGpuBackend.from_dict(gpu_file), source, listing, encode_served)

    async def main() -> None:
        assert agent.live_pods() is None  # nothing read yet: not "no pods"
        await agent.pre_start("", [])
        assert agent.live_pods() == {}
        listing.snapshot = {p.key: {} for p in pods}
        await agent.pre_start("", [])
        assert agent.live_pods() == {p.json["metadata"]["uid"]: p.key for p in pods}
        listing.snapshot = {**listing.snapshot, ("ns", "unknown-to-the-source"): {}}
        await agent.pre_start("", [])
        assert agent.live_pods() is None

    asyncio.run(main())
