"""Allocate on a node whose card 0 is in MIG mode: a container assigned a MIG instance is granted
that instance by its MIG UUID (``NVIDIA_VISIBLE_DEVICES``, which the NVIDIA container runtime reads
and which CUDA accepts too) and the parent card's device node; a whole physical card beside it is
granted as before. The inventory is the NVML backend's, discovered from the pynvml stub."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from gpupool.api.annotations import Assignment, CardRef, ContainerCards, encode_assignment
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.allocated_codec import encode_served
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.testing.fake_kubelet_types import ContainerRun
from gpupool.testing.fake_node import agent_on_fake_kubelet
from gpupool.testing.memory_pod_source import InMemoryPodSource
from tests.nodeagent.harness import NAMES, fake_pod
from tests.nodeagent.test_nvml_mig import backend_over, mixed_node

STAMP = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


def pod_json(name: str, limits: dict[str, str], ref: CardRef) -> dict[str, Any]:
    text = encode_assignment(Assignment("node-a", STAMP, (ContainerCards("main", (ref,)),), pod_uid=f"uid-{name}"))
    return {"metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}",
                         "creationTimestamp": "2024-05-01T10:00:00Z", "annotations": {NAMES.assignment: text}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "main", "resources": {"limits": limits}}]},
            "status": {"phase": "Pending"}}


@pytest.mark.slow
def test_allocate_names_the_mig_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = backend_over(mixed_node(), monkeypatch).inventory()
    backend = FakeGpuBackend(list(inventory.cards), inventory.topology, list(inventory.device_paths))
    pods = [pod_json("instance", {NAMES.gpu: "1"}, CardRef(1, "MIG-b", 35584, 285, exclusive=True)),
            pod_json("slice", {NAMES.gpu_mem: "16"}, CardRef(0, "MIG-a", 4096, 0)),
            pod_json("whole", {NAMES.gpu: "1"}, CardRef(3, "GPU-whole", 143771, 1000, exclusive=True))]
    source = InMemoryPodSource(NAMES)
    for doc in pods:
        source.put(doc)

    def make_agent(reader: PodResourcesClient) -> NodeAgent:
        return NodeAgent("node-a", NAMES, backend, source, reader, encode_served, poll_s=0.2)

    async def main() -> dict[str, ContainerRun]:
        async with agent_on_fake_kubelet(make_agent) as node:
            for doc in pods:
                await node.kubelet.handle_pod_additions([fake_pod(doc)])
            await node.kubelet.wait_idle(30)
            failed = {p.name: p.reason for p in node.kubelet.pod_manager.values() if p.phase != "Running"}
            assert not failed, failed
            return {p.name: p.runs["main"] for p in node.kubelet.pod_manager.values()}

    runs = asyncio.run(main())
    assert runs["instance"].envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-b"
    assert runs["instance"].envs["GPUPOOL_CARD_UUIDS"] == "MIG-b"
    assert runs["slice"].envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-a"
    assert runs["slice"].envs["GPUPOOL_MEMORY_LIMIT_MIB"] == "4096"
    for name in ("instance", "slice"):
        assert "/dev/nvidia0" in runs[name].devices and "/dev/nvidia1" not in runs[name].devices
    assert runs["whole"].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-whole"
    assert "/dev/nvidia1" in runs["whole"].devices and "/dev/nvidia0" not in runs["whole"].devices
