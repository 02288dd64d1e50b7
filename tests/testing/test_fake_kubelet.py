"""The fake kubelet behaves as kubelet 1.35-1.37 where the Allocate mapping depends on it
(docs/allocate-mapping.md, "kubelet guarantees"): what PodResources lists, which devices a native
sidecar gets and keeps, GetPreferredAllocation without the device-manager lock, and the batch
after a restart."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from gpupool.api.annotations import Assignment, encode_assignment
from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, NodeSpec, Placement
from gpupool.nodeagent.deviceplugin.api import podres_pb
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.types import PodResourcesSnapshot
from gpupool.testing.fake_kubelet import FakeKubelet, FakePod, TokenBucket
from gpupool.testing.node_harness import NAMES, Node, fake_pod, running_node
from gpupool.testing.node_workload import ASSIGNED_AT, fake_gpu_file

GPU_FILE = fake_gpu_file(2, memory_mib=16384)
SPEC = NodeSpec("node-a", cpu_milli=1000, memory_mib=1024, cards=tuple(
    GpuCard(i, c["uuid"], GPU_FILE["model"], c["memoryMiB"]) for i, c in enumerate(GPU_FILE["cards"])))
Containers = dict[str, int]
"""Container name → gpu-mem units (256 MiB), each on card 0."""


def pod_doc(name: str, created: int, *, init: Containers | None = None, sidecars: Containers | None = None,
            app: Containers | None = None) -> dict[str, Any]:
    """A pod bound to node-a with its assignment: regular init containers, then native sidecars
    (``restartPolicy: Always``), then app containers."""
    init, sidecars, app = init or {}, sidecars or {}, app or {}
    slices = [ContainerAssignment(c, (CardSlice(0, u * 256, 0),), init=True) for c, u in init.items()]
    slices += [ContainerAssignment(c, (CardSlice(0, u * 256, 0),)) for c, u in {**sidecars, **app}.items()]
    placement = Placement(f"default/{name}", "node-a", 0, 0, tuple(slices))

    def spec(c: str, units: int) -> dict[str, Any]:
        return {"name": c, "resources": {"limits": {NAMES.gpu_mem: str(units)}}}

    return {"metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}",
                         "creationTimestamp": f"2024-05-01T10:00:{created:02d}Z",
                         "annotations": {NAMES.assignment: encode_assignment(
                             Assignment.from_placement(placement, SPEC, ASSIGNED_AT))}},
            "spec": {"nodeName": "node-a",
                     "initContainers": [spec(c, u) for c, u in init.items()]
                     + [{**spec(c, u), "restartPolicy": "Always"} for c, u in sidecars.items()],
                     "containers": [spec(c, u) for c, u in app.items()]},
            "status": {"phase": "Pending"}}


async def listed(node: Node) -> PodResourcesSnapshot:
    client = PodResourcesClient(os.path.join(node.dir, "podres.sock"))
    try:
        return await client.list()
    finally:
        await client.close()


@pytest.mark.slow
def test_podresources_lists_active_pods_with_their_native_sidecars_and_app_containers() -> None:
    """A regular init container's devices go to the next container of its pod (here the sidecar);
    the sidecar keeps them, so the app container gets others. Init containers are not listed, nor
    is a pod kubelet rejected. kubelet answers one ContainerDevices per device ID; the agent's
    client joins them (it once kept only the last ID of each resource)."""
    sidecar = pod_doc("sidecar", 1, init={"warmup": 4}, sidecars={"side": 4}, app={"main": 4})
    rejected = pod_doc("rejected", 2, app={"main": 4})

    def reject(pod: FakePod) -> str | None:
        return "OutOfcpu" if pod.name == "rejected" else None

    async def main() -> None:
        async with running_node(GPU_FILE, [sidecar, rejected], reject=reject) as node:
            k = node.kubelet
            await k.handle_pod_additions([fake_pod(sidecar), fake_pod(rejected)])
            await k.wait_idle()
            assert [(p.name, p.phase) for p in k.pod_manager.values()] == [("sidecar", "Running"),
                                                                           ("rejected", "Failed")]
            devices = {c: k.pod_devices[("uid-sidecar", c, NAMES.gpu_mem)] for c in ("warmup", "side", "main")}
            assert devices["side"] == devices["warmup"] and not devices["side"] & devices["main"]
            assert await listed(node) == {("default", "sidecar"): {
                "side": {NAMES.gpu_mem: devices["side"]}, "main": {NAMES.gpu_mem: devices["main"]}}}
    asyncio.run(main())


@pytest.mark.slow
def test_get_preferred_allocation_is_called_without_the_device_manager_lock() -> None:
    docs = [pod_doc(f"p{i}", i, app={"main": 4}) for i in range(4)]

    async def main() -> None:
        async with running_node(GPU_FILE, docs) as node:
            locked: list[bool] = []
            answer = node.agent.preferred

            async def spy(*args: Any) -> list[str]:
                locked.append(node.kubelet.dm_lock.locked())
                return await answer(*args)

            node.agent.preferred = spy  # type: ignore[method-assign, assignment]
            await node.kubelet.handle_pod_additions([fake_pod(d) for d in docs])
            await node.kubelet.wait_idle()
            assert locked == [False] * 4
    asyncio.run(main())


def test_the_batch_after_a_restart_calls_no_plugin_but_a_finished_init_container_needs_its_plugin() -> None:
    """Right after a restart kubelet admits every pod again. A running container keeps its devices
    without a call; a finished init container's devices must be healthy, which they are not until
    the plugin registered again: that pod is rejected (kubelet 1.35-1.37 ``devicesToAllocate``)."""
    with_init = pod_doc("with-init", 1, init={"warmup": 4}, app={"main": 4})
    app_only = pod_doc("app-only", 2, app={"main": 4})

    async def main() -> None:
        async with running_node(GPU_FILE, [with_init, app_only]) as node:
            k = node.kubelet
            await k.handle_pod_additions([fake_pod(with_init), fake_pod(app_only)])
            await k.wait_idle()
            calls = k.allocate_calls
            k.sources_ready = False  # as after restart(), before gpupool's plugins registered again
            await k.drop_plugins()
            await k.readmit()
            assert k.allocate_calls == calls and k.sources_ready
            phases = {p.name: (p.phase, p.reason) for p in k.pod_manager.values()}
            assert phases["app-only"] == ("Running", "")
            assert phases["with-init"][0] == "Failed"
            assert "no healthy devices present" in phases["with-init"][1]
    asyncio.run(main())


def test_kubelets_podresources_rate_limit_is_modelled_and_the_agents_client_waits_it_out(tmp_path: Path) -> None:
    """kubelet refuses PodResources calls past 10 in a burst (100 a second after): the agent lists on
    every Allocate and GetPreferredAllocation, and a refusal used to fail a pod's admission. Another
    client (unpaced: raw calls) empties kubelet's bucket; the agent's client is refused, retries
    and gets its answer."""
    async def main() -> None:
        kubelet = FakeKubelet(str(tmp_path / "plugins"), str(tmp_path / "podres.sock"))
        await kubelet.start()
        greedy = PodResourcesClient(str(tmp_path / "podres.sock"))
        client = PodResourcesClient(str(tmp_path / "podres.sock"))
        request = podres_pb.ListPodResourcesRequest()
        try:
            kubelet.podresources_limit.rate = 5.0  # others draw on it: a token back every 200 ms
            await asyncio.gather(*(greedy._list_once(request) for _ in range(10)))
            assert await client.list() == {}
            assert kubelet.podresources_rejected > 0  # the burst was exceeded ...
            assert client.rate_limited == kubelet.podresources_rejected  # ... and every refusal retried
        finally:
            await client.close()
            await greedy.close()
            await kubelet.stop()

    asyncio.run(main())


def test_the_agents_client_paces_its_lists_so_kubelet_refuses_none(tmp_path: Path) -> None:
    """40 Lists one after another, as kubelet's calls come during admission: the client waits for
    each token kubelet's bucket would have, so every call is answered the first time (before the
    pacing, 30 of them were refused and retried after 10, 20, 40 ... ms)."""
    async def main() -> None:
        kubelet = FakeKubelet(str(tmp_path / "plugins"), str(tmp_path / "podres.sock"))
        await kubelet.start()
        client = PodResourcesClient(str(tmp_path / "podres.sock"))
        try:
            for _ in range(40):
                await client.list()
            assert kubelet.podresources_rejected == 0 and client.rate_limited == 0
        finally:
            await client.close()
            await kubelet.stop()

    asyncio.run(main())


def test_the_token_bucket_allows_the_burst_then_the_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(100.0, 10, clock=lambda: now[0])
    assert [bucket.allow() for _ in range(11)] == [True] * 10 + [False]
    now[0] += 0.01  # one token back
    assert bucket.allow() and not bucket.allow()


@pytest.mark.slow
def test_podresources_answers_an_unchanged_node_with_the_same_message_and_a_changed_one_afresh() -> None:
    """The fake builds its List answer once per state of the node (the 200-pod mapping tests list
    thousands of times): the answer is reused while nothing changed, and rebuilt after an
    allocation, a pod that ended, and a pod that kubelet forgot."""
    first, second = pod_doc("first", 1, app={"main": 4}), pod_doc("second", 2, app={"main": 4})

    def names(reply: Any) -> list[str]:
        return [p.name for p in reply.pod_resources]

    async def main() -> None:
        async with running_node(GPU_FILE, [first, second]) as node:
            k = node.kubelet
            await k.handle_pod_additions([fake_pod(first)])
            await k.wait_idle()
            before = await k.list_pod_resources()
            assert await k.list_pod_resources() is before and names(before) == ["first"]
            await k.handle_pod_additions([fake_pod(second)])  # an allocation
            await k.wait_idle()
            both = await k.list_pod_resources()
            assert names(both) == ["first", "second"]
            assert [len(c.devices) for p in both.pod_resources for c in p.containers] == [4, 4]
            k.pod_manager["uid-first"].phase = "Succeeded"  # a pod that ended
            assert names(await k.list_pod_resources()) == ["second"]
            del k.pod_manager["uid-second"]  # kubelet forgot it
            assert names(await k.list_pod_resources()) == []
    asyncio.run(main())
