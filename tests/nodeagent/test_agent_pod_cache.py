"""The node agent on its pod cache: kubelet admits pods the moment they are bound, and no Allocate
and no PodResources poll reads a pod from the API."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Mapping

import pytest

from gpupool.kube.listwatch import Backoff
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.allocated_codec import encode_served
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.pod_cache import NodePodCache
from gpupool.nodeagent.types import PodView
from gpupool.testing.fake_api import FakePodApi
from gpupool.testing.fake_node import agent_on_fake_kubelet
from gpupool.testing.fake_watch import FakeListWatch
from gpupool.testing.node_workload import generate
from tests.nodeagent.harness import NAMES, fake_pod

NODE = "node-a"


class WatchedPods:
    """The agent's :class:`PodSource` as ``KubePodSource`` builds it: reads from the cache, merge
    patches to the (fake) API."""

    def __init__(self, api: FakePodApi, cache: NodePodCache) -> None:
        self.api = api
        self.cache = cache

    async def get(self, namespace: str, name: str) -> PodView | None:
        return await self.cache.get(namespace, name)

    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        def patch() -> None:
            (current,) = (p for p in self.api.list_pods()
                          if (p["metadata"]["namespace"], p["metadata"]["name"]) == (namespace, name))
            self.api.patch_pod_annotations(namespace, name, current["metadata"]["resourceVersion"],
                                           dict(annotations))
        await asyncio.to_thread(patch)


async def never_read(namespace: str, name: str) -> PodView | None:
    raise AssertionError(f"the agent read {namespace}/{name} from the API")


@pytest.mark.slow
def test_pods_admitted_as_they_are_bound_are_allocated_from_the_watch_without_reads() -> None:
    gpu_file, workload = generate(30, cards=8, seed=5, node=NODE)

    async def main() -> None:
        api = FakePodApi()
        server = FakeListWatch(api, poll_s=0.01)
        for p in workload:  # created unbound: the binding is what the watch must bring in time
            unbound = copy.deepcopy(p.json)
            del unbound["spec"]["nodeName"]
            api.create_pod(unbound)
        cache = NodePodCache(NODE, NAMES, server.list_pod_for_all_namespaces, never_read, arrival_wait_s=0.5,
                             backoff=Backoff(0.01, 0.05), watch_timeout_s=1)
        watching = asyncio.create_task(cache.run())
        assert await cache.wait_synced(10)
        backend = FakeGpuBackend.from_dict(gpu_file)

        def make_agent(reader: PodResourcesClient) -> NodeAgent:
            return NodeAgent(NODE, NAMES, backend, WatchedPods(api, cache), reader, encode_served, poll_s=0.05)

        try:
            async with agent_on_fake_kubelet(make_agent, seed=5) as node:
                for i in range(0, len(workload), 5):
                    batch = workload[i:i + 5]
                    for p in batch:
                        api.bind_pod(*p.key, "", NODE)  # kubelet learns of it at once; our watch after
                    await node.kubelet.handle_pod_additions([fake_pod(p.json) for p in batch])
                await node.kubelet.wait_idle(60)
                await asyncio.sleep(0.2)  # a few PodResources polls over every pod
                await node.agent.flush()
                failed = [(p.name, p.reason) for p in node.kubelet.pod_manager.values() if p.phase != "Running"]
                assert not failed
                assert node.agent.stats.refused == 0
                assert sum(node.agent.stats.bases.values()) > len(workload)  # every GPU container allocated
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            await asyncio.to_thread(server.hold_watches)
            server.release_watches()
        stats = cache.stats
        assert stats.fallback_reads == 0 and not [c for c in api.calls if c.startswith("get ")]
        assert stats.hits > len(workload)  # every Allocate and every poll, from the store
        assert stats.lists == 1  # one list, then only the watch

    asyncio.run(main())
