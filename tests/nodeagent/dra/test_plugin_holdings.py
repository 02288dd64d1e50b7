"""A node that takes device-plugin pods and DRA claims: the driver refuses a claim on a card the
device plugin's pods fill, by the core's reading of what a pod holds."""

from __future__ import annotations

import asyncio

import pytest

from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.nodeagent.dra.plugin_holdings import held_by_plugin_pods
from gpupool.nodeagent.types import NodeAssignment, PodView
from tests.nodeagent.dra.dra_world import DRIVER, NODE, ClaimStore, claim_object, inventory, result, serving, temp_dir


def plugin_pod(name: str, *containers: ContainerAssignment, node: str = NODE, terminated: bool = False) -> PodView:
    placement = Placement(f"ns/{name}", node, 0, 0, containers)
    return PodView("ns", name, f"uid-{name}", node, 0.0, terminated, (), NodeAssignment(placement, {}))


def app(card: int, memory: int, compute: int = 0, exclusive: bool = False, init: bool = False) -> ContainerAssignment:
    return ContainerAssignment("c", (CardSlice(card, memory, compute, exclusive),), init=init)


def test_held_is_the_cores_reading_summed_over_the_nodes_live_pods() -> None:
    pods = [plugin_pod("a", app(0, 4096, 300), app(0, 2048, 100)),
            plugin_pod("b", app(0, 1024), app(0, 8192, 500, init=True)),  # init: the larger of the two
            plugin_pod("c", app(1, 16384, 1000, exclusive=True)),
            plugin_pod("gone", app(0, 9999), terminated=True),
            plugin_pod("elsewhere", app(0, 9999), node="node-b")]
    assert held_by_plugin_pods(NODE, pods) == {0: (6144 + 8192, 400 + 500, False), 1: (16384, 1000, True)}


@pytest.mark.parametrize(("claim_memory", "refusal"), [
    pytest.param("4Gi", "", id="fits-beside-the-plugin-pod"),
    pytest.param("8Gi", "would hold 20480 MiB and 30% with the 0 claims prepared on it and 12288 MiB, 30% of "
                        "device-plugin pods", id="over-with-the-plugin-pod"),
])
def test_a_claim_counts_what_device_plugin_pods_hold(claim_memory: str, refusal: str) -> None:
    pods = [plugin_pod("p", app(0, 12288, 300))]

    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            ref = claims.add(claim_object("x", "uid-x", [result("gpu-0", claim_memory)]))
            async with serving(d, claims, [inventory()], lambda: held_by_plugin_pods(NODE, pods)) as node:
                answer = (await node.kubelet.prepare(DRIVER, [ref]))["uid-x"]
                assert (refusal in answer.error) if refusal else answer.error == ""
    asyncio.run(main())


def test_a_card_a_device_plugin_pod_holds_whole_takes_no_claim() -> None:
    pods = [plugin_pod("p", app(1, 16384, 1000, exclusive=True))]

    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            ref = claims.add(claim_object("x", "uid-x", [result("gpu-1", "256Mi")]))
            async with serving(d, claims, [inventory()], lambda: held_by_plugin_pods(NODE, pods)) as node:
                answer = (await node.kubelet.prepare(DRIVER, [ref]))["uid-x"]
                assert "device gpu-1 is held whole by a device-plugin pod" in answer.error
    asyncio.run(main())


@pytest.mark.slow
def test_an_allocate_is_checked_against_the_prepared_claims_on_its_card() -> None:
    """The other direction: the device plugin refuses a pod whose card the prepared claims fill."""
    from gpupool.nodeagent.agent import NodeAgent
    from gpupool.nodeagent.allocated_codec import encode_served
    from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
    from gpupool.nodeagent.nvml.fake import FakeGpuBackend
    from gpupool.testing.fake_node import agent_on_fake_kubelet
    from gpupool.testing.memory_pod_source import InMemoryPodSource
    from tests.nodeagent.harness import NAMES, fake_pod
    from tests.nodeagent.test_schedule_check import mib, pod_json

    source = InMemoryPodSource(NAMES)
    backend = FakeGpuBackend.from_dict({"model": "T4", "cards": [{"uuid": "GPU-0", "memoryMiB": 16384},
                                                                 {"uuid": "GPU-1", "memoryMiB": 16384}]})

    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            ref = claims.add(claim_object("x", "uid-x", [result("gpu-0", "12Gi", pool="node-a")]))
            async with serving(d, claims, [backend.inventory()]) as dra:
                assert (await dra.kubelet.prepare(DRIVER, [ref]))["uid-x"].error == ""

                def make_agent(reader: PodResourcesClient) -> NodeAgent:
                    agent = NodeAgent("node-a", NAMES, backend, source, reader, encode_served, poll_s=0.05)
                    agent.claims_granted = dra.driver.state.as_pods
                    return agent

                async with agent_on_fake_kubelet(make_agent) as node:
                    for name, memory, phase in (("fits", 4096, "Running"), ("over", 8192, "Failed")):
                        doc = pod_json(name, {"main": mib(memory)})
                        source.put(doc)
                        await node.kubelet.handle_pod_additions([fake_pod(doc)])
                        await node.kubelet.wait_idle(30)
                        pod = node.kubelet.pod_manager[doc["metadata"]["uid"]]
                        assert pod.phase == phase, (name, pod.phase)
                    assert node.agent.stats.refused >= 1
    asyncio.run(main())
