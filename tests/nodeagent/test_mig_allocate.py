"""Allocate on a node whose card 0 is in MIG mode: a container assigned a MIG instance is granted
that instance by its MIG UUID (``NVIDIA_VISIBLE_DEVICES``, which the NVIDIA container runtime reads
and which CUDA accepts too), the parent card's device node and the instance's capability device
nodes where the driver lists them; a whole physical card beside it is granted as before. The
inventory is the NVML backend's, discovered from the pynvml stub."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from gpupool.api.annotations import Assignment, CardRef, ContainerCards, encode_assignment
from gpupool.core.model import CardSlice, ContainerAssignment
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.allocated_codec import encode_served
from gpupool.nodeagent.container_grant import build_grant
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.testing.fake_kubelet_types import ContainerRun
from gpupool.testing.fake_node import agent_on_fake_kubelet
from gpupool.testing.memory_pod_source import InMemoryPodSource
from tests.nodeagent.harness import NAMES, fake_pod
from tests.nodeagent.test_nvml_mig import backend_over, mixed_node, write_access

STAMP = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


def pod_json(name: str, limits: dict[str, str], ref: CardRef) -> dict[str, Any]:
    text = encode_assignment(Assignment("node-a", STAMP, (ContainerCards("main", (ref,)),), pod_uid=f"uid-{name}"))
    return {"metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}",
                         "creationTimestamp": "2024-05-01T10:00:00Z", "annotations": {NAMES.assignment: text}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "main", "resources": {"limits": limits}}]},
            "status": {"phase": "Pending"}}


class DiscoveredBackend(FakeGpuBackend):
    """The fake backend's health machinery over an inventory the NVML backend discovered."""

    def __init__(self, inventory: GpuInventory) -> None:
        super().__init__(list(inventory.cards), inventory.topology, list(inventory.device_paths))
        self._discovered = inventory

    def inventory(self) -> GpuInventory:
        return self._discovered


def test_two_mig_devices_of_one_card_list_its_device_node_once(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    write_access(tmp_path, 0, 2, None, 21)
    write_access(tmp_path, 0, 2, 0, 22)
    inventory = backend_over(mixed_node(), monkeypatch, tmp_path).inventory()
    grant = build_grant("ns/p", ContainerAssignment("main", (CardSlice(0, 71424, 428), CardSlice(1, 35584, 285))),
                        {0: "MIG-a", 1: "MIG-b"}, inventory)
    assert grant.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-a,MIG-b"
    assert [d.host_path for d in grant.devices] == [
        "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22",
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


@pytest.mark.slow
def test_allocate_names_the_mig_instance(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    write_access(tmp_path, 0, 3, None, 31)
    write_access(tmp_path, 0, 3, 0, 32)
    backend = DiscoveredBackend(backend_over(mixed_node(), monkeypatch, tmp_path).inventory())
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
    assert {"/dev/nvidia-caps/nvidia-cap31", "/dev/nvidia-caps/nvidia-cap32"} <= set(runs["instance"].devices)
    assert not any("nvidia-caps" in d for d in runs["slice"].devices)  # MIG-a: the driver listed none
    assert runs["whole"].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-whole"
    assert "/dev/nvidia1" in runs["whole"].devices and "/dev/nvidia0" not in runs["whole"].devices
