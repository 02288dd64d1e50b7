"""Grants of dead workloads are released on the node: a pod whose containers kubelet ended, or that
kubelet no longer lists, holds nothing in the agent's own accounting, so it neither refuses the pod
that gets its cards next nor leaves its containers in a same-named successor's ``allocated-v1``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client import generate_latest

from gpupool.api.annotations import decode_allocated
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.allocated_codec import encode_served, served_resources
from gpupool.nodeagent.allocation_mapper import AllocationMapper
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.metrics import agent_registry
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.testing.fake_node import FakeNode, agent_on_fake_kubelet
from gpupool.testing.memory_pod_source import InMemoryPodSource
from tests.nodeagent.harness import NAMES, fake_pod
from tests.nodeagent.test_schedule_check import CARD, mib, pod_json

BACKEND = {"model": "T4", "cards": [{"uuid": "GPU-0", "memoryMiB": CARD}, {"uuid": "GPU-1", "memoryMiB": CARD}]}
Scenario = Callable[[FakeNode, InMemoryPodSource], Awaitable[None]]


def run(scenario: Scenario, *, forget_after_s: float = 60.0) -> NodeAgent:
    source = InMemoryPodSource(NAMES)
    backend = FakeGpuBackend.from_dict(BACKEND)

    def make_agent(reader: PodResourcesClient) -> NodeAgent:
        agent = NodeAgent("node-a", NAMES, backend, source, reader, encode_served, poll_s=0.05)
        agent.mapper = AllocationMapper("node-a", forget_after_s=forget_after_s)
        return agent

    async def main() -> NodeAgent:
        async with agent_on_fake_kubelet(make_agent) as node:
            await scenario(node, source)
            return node.agent

    return asyncio.run(main())


async def admit(node: FakeNode, source: InMemoryPodSource, doc: dict[str, Any]) -> str:
    source.put(doc)
    await node.kubelet.handle_pod_additions([fake_pod(doc)])
    await node.kubelet.wait_idle(30)
    return node.kubelet.pod_manager[doc["metadata"]["uid"]].phase


@pytest.mark.slow
def test_a_pod_whose_containers_kubelet_ended_does_not_refuse_the_next_one() -> None:
    """kubelet knows first that a pod finished (it frees its devices); the pod watch learns the phase
    later. The next pod on the card must be granted meanwhile."""
    async def scenario(node: FakeNode, source: InMemoryPodSource) -> None:
        first = pod_json("first", {"main": mib(12288)}, phase="Running")
        assert await admit(node, source, first) == "Running"
        node.kubelet.pod_manager["uid-first"].phase = "Succeeded"  # the API still says Running
        assert await admit(node, source, pod_json("second", {"main": mib(12288)})) == "Running"

    agent = run(scenario)
    assert agent.stats.refused == 0


@pytest.mark.slow
def test_a_running_pod_still_refuses_an_over_commitment() -> None:
    """The release is for dead grants only: a live one still counts."""
    async def scenario(node: FakeNode, source: InMemoryPodSource) -> None:
        assert await admit(node, source, pod_json("first", {"main": mib(12288)}, phase="Running")) == "Running"
        assert await admit(node, source, pod_json("second", {"main": mib(12288)})) == "Failed"

    assert run(scenario).stats.refused == 1


@pytest.mark.slow
def test_a_pod_kubelet_no_longer_lists_is_released_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(node: FakeNode, source: InMemoryPodSource) -> None:
        first = pod_json("first", {"main": mib(12288)}, phase="Running")
        assert await admit(node, source, first) == "Running"
        del node.kubelet.pod_manager["uid-first"]  # deleted: kubelet forgets it
        source.delete("default", "first")
        with caplog.at_level("INFO", logger="gpupool.nodeagent.agent"):
            await asyncio.sleep(0.3)  # the poller reads PodResources every 50 ms; the grace is 0 s
        assert served_resources(node.agent.allocated_annotation(("default", "first"))) == {}

    agent = run(scenario, forget_after_s=0.0)
    assert agent.stats.released_pods == 1
    exported = generate_latest(agent_registry(agent)).decode()
    assert "gpupool_node_pods_released_total 1.0" in exported
    assert "released the grants of pod default/first (main): kubelet no longer lists it" in caplog.text


@pytest.mark.slow
def test_a_same_named_successor_does_not_inherit_the_dead_pods_containers() -> None:
    """A pod replaced under the same name (StatefulSet) within the mapper's grace: the successor's
    ``allocated-v1`` lists its own containers only."""
    async def scenario(node: FakeNode, source: InMemoryPodSource) -> None:
        first = pod_json("web", {"main": mib(4096)}, phase="Running")
        assert await admit(node, source, first) == "Running"
        del node.kubelet.pod_manager["uid-web"]
        successor = pod_json("web", {"worker": mib(8192, card=1)})
        successor["metadata"]["uid"] = "uid-web-2"
        assert await admit(node, source, successor) == "Running"
        allocated = decode_allocated(node.agent.allocated_annotation(("default", "web")))
        assert [(c.name, [(r.index, r.memory_mib) for r in c.cards]) for c in allocated.containers] == [
            ("worker", [(1, 8192)])]

    run(scenario)
