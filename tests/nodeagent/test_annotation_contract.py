"""The node side and the extender read each other's annotations: one schema, both directions.

Each test writes a value with one side's real encoder and reads it with the other side's real
reader. Until these shared one codec module the node wrote ``"version"`` where the extender reads
``"v"`` (inventory and allocated were refused by the extender) and expected ``compute`` where the
extender writes ``computeMilli`` (every real assignment was refused by the node).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from gpupool.api.annotations import Assignment, decode_allocated, encode_assignment
from gpupool.api.names import ResourceNames
from gpupool.core.model import (
    CardSlice,
    ContainerAssignment,
    GpuCard,
    LinkLevel,
    NodeSpec,
    Placement,
    Topology,
)
from gpupool.kube.translate import node_spec, pod_request
from gpupool.nodeagent.allocated_codec import encode_served, served_resources
from gpupool.nodeagent.allocation_mapper import ServedRecord
from gpupool.nodeagent.device_layout import DeviceLayout
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.kube_pod_source import node_patch
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.pod_view import pod_view_from_json
from gpupool.nodeagent.served_container import ServedContainer

NAMES = ResourceNames()
WHEN = dt.datetime(2024, 5, 1, 10, 0, tzinfo=dt.UTC)
CARDS = (GpuCard(0, "GPU-aaaa", "NVIDIA-H200", 143771), GpuCard(1, "GPU-bbbb", "NVIDIA-H200", 143771))


def _pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "p", "uid": "u1", "annotations": annotations,
                         "creationTimestamp": "2024-05-01T10:00:00Z"},
            "spec": {"nodeName": "n1", "containers": [
                {"name": "main", "resources": {"limits": {NAMES.gpu_mem: "16", NAMES.gpu_core: "30"}}}]},
            "status": {"phase": "Pending"}}


def test_the_node_reads_the_assignment_the_extender_writes() -> None:
    spec = NodeSpec("n1", cpu_milli=1000, memory_mib=1024, cards=CARDS)
    placement = Placement("ns/p", "n1", 0, 0, (ContainerAssignment("main", (CardSlice(1, 4096, 300),)),))
    text = encode_assignment(Assignment.from_placement(placement, spec, WHEN))

    view = pod_view_from_json(_pod({NAMES.assignment: text}), NAMES)

    assert view.assignment_error == ""
    assert view.assignment is not None
    assert view.assignment.placement.node == "n1"
    main = view.assignment.container("main")
    assert main is not None and main.slices == (CardSlice(1, 4096, 300),)
    assert dict(view.assignment.uuids) == {1: "GPU-bbbb"}


def test_a_broken_assignment_is_reported_with_the_field_not_guessed() -> None:
    doc = {"v": 1, "node": "n1", "time": "2024-05-01T10:00:00Z",
           "containers": [{"name": "main", "init": False,
                           "cards": [{"index": 0, "uuid": "GPU-aaaa", "memoryMiB": 4096, "compute": 300,
                                      "exclusive": False}]}]}
    view = pod_view_from_json(_pod({NAMES.assignment: json.dumps(doc)}), NAMES)
    assert view.assignment is None
    assert "ns/p" in view.assignment_error and "computeMilli" in view.assignment_error


def test_the_extender_reads_the_inventory_the_node_publishes() -> None:
    backend = FakeGpuBackend.from_dict({"model": "NVIDIA-H200", "topology": [[0, 1]],
                                        "cards": [{"uuid": "GPU-aaaa", "memoryMiB": 143771},
                                                  {"uuid": "GPU-bbbb", "memoryMiB": 100000}]})
    patch = node_patch(NAMES, backend.inventory())
    node = {"metadata": {"name": "n1", **patch["metadata"]},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}}

    spec = node_spec(node, NAMES)

    assert [(c.index, c.uuid, c.model, c.memory_mib) for c in spec.cards] == [
        (0, "GPU-aaaa", "NVIDIA-H200", 143771), (1, "GPU-bbbb", "NVIDIA-H200", 100000)]
    assert spec.topology is not None and spec.topology.levels[0][1] < LinkLevel.SYSTEM
    assert patch["metadata"]["labels"] == {"gpupool.io/gpu-model": "NVIDIA-H200"}


def test_the_extender_confirms_with_the_allocated_value_the_node_writes() -> None:
    record = ServedRecord(("ns", "p"), "u1", "main", False, NAMES.gpu_mem, frozenset({"g1-m0"}),
                          (CardSlice(1, 4096, 300),), ("GPU-bbbb",), "unique", 0.0)
    served = ServedContainer("main", False, record, {NAMES.gpu_mem: 16, NAMES.gpu_core: 30})

    text = encode_served("n1", WHEN, [served])

    decoded = decode_allocated(text)  # the extender's reader
    assert (decoded.node, decoded.time) == ("n1", WHEN)
    [main] = decoded.containers
    assert [(r.index, r.uuid, r.memory_mib, r.compute) for r in main.cards] == [(1, "GPU-bbbb", 4096, 300)]
    assert served_resources(text) == {"main": frozenset({NAMES.gpu_mem, NAMES.gpu_core})}
    # ... and the node agent reads its own value back after a restart.
    assert pod_view_from_json(_pod({NAMES.allocated: text}), NAMES).allocated == {
        "main": frozenset({NAMES.gpu_mem, NAMES.gpu_core})}


def test_one_gpu_mem_unit_is_one_kubelet_device_of_the_node() -> None:
    """kubelet admits a container only if the node advertises as many free devices as its limit.

    So the extender must read ``gpu-mem`` in the node's device unit: a container asking for every
    memory device of a card asks for exactly that card's memory. (The extender used to read MiB:
    a 4 GiB slice had to be written ``gpu-mem: 4096``, which kubelet could only admit with 4,096
    devices of 256 MiB, i.e. 1 TiB.)
    """

    card = GpuCard(0, "GPU-aaaa", "T4", 16384)
    inventory = GpuInventory((card,), Topology.flat(1), ("/dev/nvidia0",))
    devices = DeviceLayout(NAMES).devices(NAMES.gpu_mem, inventory)
    cores = DeviceLayout(NAMES).devices(NAMES.gpu_core, inventory)
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [
        {"name": "main", "resources": {"limits": {NAMES.gpu_mem: str(len(devices)), NAMES.gpu_core: "30"}}}]}}

    gpu = pod_request(pod, NAMES).containers[0].gpu

    assert gpu is not None and gpu.memory_mib == card.memory_mib == len(devices) * 256
    assert gpu.compute == 300 and len(cores) == 100  # one percent of a card per device
