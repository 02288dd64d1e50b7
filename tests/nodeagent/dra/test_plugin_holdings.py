"""A node that takes device-plugin pods and DRA claims: the driver refuses a claim on a card the
device plugin's pods fill, by the core's card rule on what they hold (the extender's rule)."""

from __future__ import annotations

import asyncio

import pytest

from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.nodeagent.dra.plugin_holdings import plugin_pods
from gpupool.nodeagent.types import NodeAssignment, PodView
from tests.nodeagent.dra.dra_world import DRIVER, NODE, ClaimStore, claim_object, inventory, result, serving, temp_dir


def plugin_pod(name: str, *containers: ContainerAssignment, node: str = NODE, terminated: bool = False) -> PodView:
    placement = Placement(f"ns/{name}", node, 0, 0, containers)
    return PodView("ns", name, f"uid-{name}", node, 0.0, terminated, (), NodeAssignment(placement, {}))


def app(card: int, memory: int, compute: int = 0, exclusive: bool = False, init: bool = False) -> ContainerAssignment:
    return ContainerAssignment("c", (CardSlice(card, memory, compute, exclusive),), init=init)


def test_the_plugin_pods_are_the_nodes_live_pods_with_an_assignment_here() -> None:
    pods = [plugin_pod("a", app(0, 4096, 300)),
            plugin_pod("gone", app(0, 9999), terminated=True),
            plugin_pod("elsewhere", app(0, 9999), node="node-b")]
    assert [p.name for p in plugin_pods(NODE, pods)] == ["a"]


@pytest.mark.parametrize(("claim_memory", "refusal"), [
    pytest.param("1Gi", "", id="fits-beside-app-and-init"),
    pytest.param("2Gi", "2048 MiB and 0% asked, 15360 MiB and 90% of its 16384 MiB, 100% held by ns/p",
                 id="init-counts-as-the-larger"),
])
def test_a_pods_init_and_app_containers_count_by_the_cores_rule(claim_memory: str, refusal: str) -> None:
    """App containers add up (4 + 3 GiB), an init container holds its card alone (8 GiB, the
    larger): 15 GiB of 16 are held, as the extender books the same pod."""
    pods = [plugin_pod("p", app(0, 4096, 300), app(0, 3072, 100), app(0, 15360, 900, init=True))]

    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            ref = claims.add(claim_object("x", "uid-x", [result("gpu-0", claim_memory)]))
            async with serving(d, claims, [inventory()], lambda: plugin_pods(NODE, pods)) as node:
                answer = (await node.kubelet.prepare(DRIVER, [ref]))["uid-x"]
                assert (refusal in answer.error) if refusal else answer.error == "", answer.error
    asyncio.run(main())


@pytest.mark.parametrize(("claim_memory", "refusal"), [
    pytest.param("4Gi", "", id="fits-beside-the-plugin-pod"),
    pytest.param("8Gi", "8192 MiB and 0% asked, 12288 MiB and 30% of its 16384 MiB, 100% held by ns/p",
                 id="over-with-the-plugin-pod"),
])
def test_a_claim_counts_what_device_plugin_pods_hold(claim_memory: str, refusal: str) -> None:
    pods = [plugin_pod("p", app(0, 12288, 300))]

    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            ref = claims.add(claim_object("x", "uid-x", [result("gpu-0", claim_memory)]))
            async with serving(d, claims, [inventory()], lambda: plugin_pods(NODE, pods)) as node:
                answer = (await node.kubelet.prepare(DRIVER, [ref]))["uid-x"]
                assert (refusal in answer.error) if refusal else answer.error == ""
    asyncio.run(main())


def test_a_card_a_device_plugin_pod_holds_whole_takes_no_claim() -> None:
    pods = [plugin_pod("p", app(1, 16384, 1000, exclusive=True))]

    async def main() -> None:
        with temp_dir() as d:
            claims = ClaimStore()
            ref = claims.add(claim_object("x", "uid-x", [result("gpu-1", "256Mi")]))
            async with serving(d, claims, [inventory()], lambda: plugin_pods(NODE, pods)) as node:
                answer = (await node.kubelet.prepare(DRIVER, [ref]))["uid-x"]
                assert "device gpu-1 (GPU-0001) is held whole by ns/p" in answer.error, answer.error
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
                    return NodeAgent("node-a", NAMES, backend, source, reader, encode_served, poll_s=0.05,
                                     claims_granted=dra.driver.state.as_pods)

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
