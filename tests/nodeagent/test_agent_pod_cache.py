"""The node agent on its pod cache: kubelet admits pods the moment they are bound, and no Allocate
and no PodResources poll reads a pod from the API; a pod the watch never brings is read once, and
the grant is made from it as if the watch had brought it (its checkpoint directory included)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpupool.api import lending as contract
from gpupool.api.lending import LendingNames
from gpupool.kube.listwatch import Backoff
from gpupool.kube.podapi import NotFoundError
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.allocated_codec import encode_served
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.isolation.backends import NoEnforcement
from gpupool.nodeagent.lending.checkpoint import CheckpointEnforcement, CheckpointStore
from gpupool.nodeagent.lending.pods import LendingPods
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


async def never_read(namespace: str, name: str) -> dict[str, Any] | None:
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


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_replacement_the_watch_never_brings_is_granted_its_controllers_checkpoint_directory(
        tmp_path: Path, checkpointed: bool) -> None:
    """Issue 26: the watch lags through the whole admission of a ReplicaSet's replacement, so the
    cache reads it from the API. The grant kubelet gets mounts the directory keyed by the
    ReplicaSet's UID (where the reclaimed pod wrote its checkpoints) and names the newest in
    ``GPUPOOL_RESUME_FROM``; it used to be keyed by namespace/name (the lending side never saw the
    read's pod), so the replacement started over."""
    gpu_file, workload = generate(1, cards=2, seed=3, node=NODE)
    obj = copy.deepcopy(workload[0].json)
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train",
                                           "uid": "rs-uid", "controller": True}]
    namespace = obj["metadata"]["namespace"]
    store = CheckpointStore(str(tmp_path))
    task_dir = store.directory(namespace, "rs-uid")
    if checkpointed:  # the reclaimed pod's checkpoint
        Path(task_dir, "step-40").write_text("40\n")

    async def main() -> None:
        api = FakePodApi()
        server = FakeListWatch(api, poll_s=0.01)
        reads: list[tuple[str, str]] = []

        async def read(namespace: str, name: str) -> dict[str, Any] | None:
            reads.append((namespace, name))
            try:
                return await asyncio.to_thread(api.get_pod, namespace, name)
            except NotFoundError:
                return None

        cache = NodePodCache(NODE, NAMES, server.list_pod_for_all_namespaces, read, arrival_wait_s=0.2,
                             backoff=Backoff(0.01, 0.05), watch_timeout_s=1)
        lending = LendingPods(LendingNames(NAMES.domain))
        cache.feeds.append(lending)  # as the assembly wires it
        enforcement = CheckpointEnforcement(NoEnforcement(), store, lending.get)
        watching = asyncio.create_task(cache.run())
        assert await cache.wait_synced(10)
        await asyncio.to_thread(server.hold_watches)  # the watch lags for the whole admission
        created = api.create_pod(obj)
        backend = FakeGpuBackend.from_dict(gpu_file)

        def make_agent(reader: PodResourcesClient) -> NodeAgent:
            return NodeAgent(NODE, NAMES, backend, WatchedPods(api, cache), reader, encode_served, poll_s=0.05,
                             enforcement=enforcement)

        try:
            async with agent_on_fake_kubelet(make_agent, seed=3) as node:
                await node.kubelet.handle_pod_additions([fake_pod(created)])
                await node.kubelet.wait_idle(30)
                (admitted,) = node.kubelet.pod_manager.values()
                assert (admitted.phase, admitted.reason) == ("Running", "")
                granted = [run for run in admitted.runs.values() if run.devices]
                assert granted, "no container was granted a card"
                for run in granted:
                    assert run.mounts[contract.CHECKPOINT_MOUNT] == (task_dir, False)
                    assert run.envs[contract.CHECKPOINT_DIR_ENV] == contract.CHECKPOINT_MOUNT
                    assert run.envs.get(contract.RESUME_FROM_ENV) == (
                        f"{contract.CHECKPOINT_MOUNT}/step-40" if checkpointed else None)
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            server.release_watches()
            await asyncio.to_thread(server.hold_watches)
            server.release_watches()
        assert cache.stats.reads_handed_on == 1 and reads  # read from the API, handed on once
        assert os.listdir(os.path.dirname(task_dir)) == [os.path.basename(task_dir)]  # no namespace/name directory

    asyncio.run(main())
