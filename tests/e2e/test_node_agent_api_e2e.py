"""The node agent against the real apiserver, with the fake kubelet (real gRPC) admitting the pods.

kube-scheduler and the ``gpupool extender`` process bind pods onto a Node object without a real
kubelet; the node agent runs in this process on the real API (``KubePodSource``: it publishes the
node's inventory, watches the bound pods, writes ``allocated-v1``) behind its three device-plugin
servers; the fake kubelet (modelled on kubelet 1.37's device manager) registers them and admits the
bound pods in concurrent batches, calling GetPreferredAllocation/Allocate/PreStartContainer over
gRPC. At the end the pods' annotations agree with each other and with what every container got:
the extender's ``assignment-v1``, the node's ``allocated-v1`` and each container's env name the same
cards and limits.

Cheaper than a real kubelet and able to admit many pods in one batch, which the real kubelet here
(one fake runtime, a few pods) does not exercise.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.annotations import decode_allocated, decode_assignment
from gpupool.api.names import ResourceNames
from gpupool.kube.translate import node_spec
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.allocated_codec import encode_served
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.kube_pod_source import KubePodSource
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testing.fake_kubelet import FakeKubelet, FakePod
from gpupool.testing.fake_node import agent_on_fake_kubelet
from tests.e2e.e2e_support import ContainerLimits, ExtenderProcess, MakeNode, expected_grant, gpu_pod_manifest, wait_for

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
CARDS = [{"uuid": f"GPU-api-{i:04d}", "memoryMiB": 16384} for i in range(4)]


def shared(mem_units: int, percent: int) -> dict[str, str]:
    return {NAMES.gpu_mem: str(mem_units), NAMES.gpu_core: str(percent)}


#: name -> (init containers, app containers): equal-request twins, multi-container, init + app, whole.
PODS: dict[str, tuple[list[ContainerLimits], list[ContainerLimits]]] = {
    **{f"twin-{i}": ([], [("main", shared(8, 20))]) for i in range(4)},
    "multi": ([], [("worker", shared(4, 10)), ("helper", shared(4, 10)), ("log-shipper", {})]),
    "with-init": ([("warmup", shared(4, 10))], [("main", shared(8, 20))]),
    "whole": ([], [("main", {NAMES.gpu: "1"})]),
}


@contextlib.asynccontextmanager
async def node_side(node: str, kubeconfig: str) -> AsyncIterator[tuple[FakeKubelet, NodeAgent]]:
    """The node agent (real API) behind its plugin servers, registered with a fake kubelet."""
    backend = FakeGpuBackend.from_dict({"model": "Tesla-T4", "cards": CARDS, "topology": [[0, 1], [2, 3]]})
    source = KubePodSource(NAMES, node, kubeconfig)

    def make_agent(reader: PodResourcesClient) -> NodeAgent:
        return NodeAgent(node, NAMES, backend, source, reader, encode_served, poll_s=0.2)

    async def publish(agent: NodeAgent) -> None:  # what `gpupool node-agent` does first
        await source.publish_node(node, agent.inventory)

    watching = asyncio.create_task(source.run())
    try:
        assert await source.cache.wait_synced(30)
        async with agent_on_fake_kubelet(make_agent, seed=7, before_plugins=publish, prefix="gpe2e") as side:
            yield side.kubelet, side.agent
        # kubelet admitted pods bound long before: every read came from the watch
        assert source.cache.stats.fallback_reads == 0
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching


def fake_pod(pod: client.V1Pod) -> FakePod:
    """kubelet's view of a bound pod: identity, creation time, gpupool limits per container."""
    def limits(containers: list[Any] | None) -> list[tuple[str, dict[str, int]]]:
        return [(c.name, {k: int(v) for k, v in ((c.resources and c.resources.limits) or {}).items()
                          if k in NAMES.all()}) for c in containers or []]

    meta = pod.metadata
    return FakePod(uid=meta.uid, namespace=meta.namespace, name=meta.name,
                   created=meta.creation_timestamp.timestamp(),
                   init=limits(pod.spec.init_containers), app=limits(pod.spec.containers))


def test_extender_binds_fake_kubelet_admits_and_annotations_agree(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, control_plane: ControlPlane,
    gpupool_extender: ExtenderProcess,
) -> None:
    node = make_node(f"e2e-api-{uuid.uuid4().hex[:6]}", {"cpu": "64", "memory": "256Gi", "pods": "250"})

    async def main() -> None:
        async with node_side(node, str(control_plane.kubeconfig)) as (kubelet, agent):
            # The extender reads the inventory the agent published (its own reader, via the watch).
            spec = node_spec(core_v1.read_node(node), NAMES)
            assert [(c.uuid, c.memory_mib, c.model) for c in spec.cards] == [
                (c["uuid"], c["memoryMiB"], "Tesla-T4") for c in CARDS]
            probe = {"metadata": {"name": "probe", "namespace": "default", "uid": "probe"},
                     "spec": {"containers": [{"name": "main", "resources": {"limits": {NAMES.gpu: "4"}}}]}}
            await asyncio.to_thread(wait_for, lambda: gpupool_extender.passes(probe, [node]),
                                    timeout=30, what="the extender's ledger holds the node's four cards")

            for name, (init, app) in PODS.items():
                core_v1.create_namespaced_pod(namespace, gpu_pod_manifest(name, app, init=init, node=node))

            def all_bound() -> list[client.V1Pod] | None:
                pods = core_v1.list_namespaced_pod(namespace).items
                return pods if len(pods) == len(PODS) and all(p.spec.node_name == node for p in pods) else None

            bound = await asyncio.to_thread(wait_for, all_bound, timeout=120, what="every pod bound")
            fakes = [fake_pod(p) for p in bound]
            random.Random(3).shuffle(fakes)
            # Two config updates in flight at once; kubelet serialises admission, sorted by creation.
            await asyncio.gather(kubelet.handle_pod_additions(fakes[:4]), kubelet.handle_pod_additions(fakes[4:]))
            await kubelet.wait_idle(60)
            await agent.flush()

            by_key = {(p.namespace, p.name): p for p in kubelet.pod_manager.values()}
            assert all(p.phase == "Running" for p in by_key.values()), [(p.name, p.reason) for p in by_key.values()]
            assert agent.stats.refused == 0 and agent.stats.mismatches == 0
            assert set(agent.stats.bases) <= {"unique", "newest"}, agent.stats.bases
            checked = 0
            for pod in core_v1.list_namespaced_pod(namespace).items:
                notes = pod.metadata.annotations or {}
                assignment = decode_assignment(notes[NAMES.assignment])
                allocated = decode_allocated(notes[NAMES.allocated])
                # The extender's confirmation rule: allocated-v1 names the node of the assignment.
                assert assignment.node == allocated.node == node == pod.spec.node_name
                assigned = {c.name: c.cards for c in assignment.containers}
                served = {c.name: c.cards for c in allocated.containers}
                assert {k: [(r.index, r.uuid, r.memory_mib, r.compute) for r in v] for k, v in served.items()} == {
                    k: [(r.index, r.uuid, r.memory_mib, r.compute) for r in v] for k, v in assigned.items()}
                fake = by_key[(namespace, pod.metadata.name)]
                for cname, run in fake.runs.items():
                    assert not run.conflicts, (pod.metadata.name, cname, run.conflicts)
                    if cname not in assigned:
                        assert run.envs == {} and run.devices == [], (pod.metadata.name, cname)
                        continue
                    want = expected_grant(namespace, pod.metadata.name, cname, assigned[cname])
                    assert run.envs == want, (pod.metadata.name, cname)
                    assert {f"/dev/nvidia{r.index}" for r in assigned[cname]} <= set(run.devices)
                    checked += 1
            assert checked == sum(1 for init, app in PODS.values() for _, limits in init + app if limits)

    asyncio.run(main())
