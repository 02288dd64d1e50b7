"""A node agent that cannot enforce shares grants whole cards only (docs/isolation-backends.md).

With ``--isolation auto`` and no interception library the node publishes ``shares: false`` and the
extender places no slice there; a slice placed anyway (an extender that did not read the notice, an
older one) fails Allocate with the reason, while a whole card, by any of gpupool's names, is granted.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from gpupool.api.annotations import Assignment, CardRef, ContainerCards, encode_assignment
from gpupool.nodeagent.agent import NodeAgent
from gpupool.nodeagent.allocated_codec import encode_served
from gpupool.nodeagent.deviceplugin.podresources import PodResourcesClient
from gpupool.nodeagent.isolation.backends import NoEnforcement, choose_backend, enforcement_notice
from gpupool.nodeagent.kube_pod_source import node_patch
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.schedule_check import WHOLE_CARDS_ONLY
from gpupool.testing.fake_node import agent_on_fake_kubelet
from gpupool.testing.memory_pod_source import InMemoryPodSource
from tests.nodeagent.harness import NAMES, fake_pod

CARD = 16384
STAMP = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


def pod_json(name: str, limits: dict[str, str], ref: CardRef) -> dict[str, Any]:
    text = encode_assignment(Assignment("node-a", STAMP, (ContainerCards("main", (ref,)),), pod_uid=f"uid-{name}"))
    return {"metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}",
                         "creationTimestamp": "2024-05-01T10:00:00Z", "annotations": {NAMES.assignment: text}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "main", "resources": {"limits": limits}}]},
            "status": {"phase": "Pending"}}


@pytest.mark.slow
@pytest.mark.parametrize("shares", [pytest.param(False, id="whole-cards-only"), pytest.param(True, id="shares")])
def test_slices_are_refused_and_whole_cards_granted_where_shares_are_off(shares: bool) -> None:
    pods = {"slice": pod_json("slice", {NAMES.gpu_mem: "16"}, CardRef(0, "GPU-0", 4096, 0)),
            "whole": pod_json("whole", {NAMES.gpu: "1"}, CardRef(1, "GPU-1", CARD, 1000, exclusive=True)),
            "by-compute": pod_json("by-compute", {NAMES.gpu_core: "100"},
                                   CardRef(2, "GPU-2", CARD, 1000, exclusive=True))}
    backend = FakeGpuBackend.from_dict({"model": "T4", "cards": [{"uuid": f"GPU-{i}", "memoryMiB": CARD}
                                                                 for i in range(3)]})
    source = InMemoryPodSource(NAMES)
    for doc in pods.values():
        source.put(doc)
    reports: list[tuple[tuple[str, str], str]] = []

    async def report(pod: tuple[str, str], reason: str) -> None:
        reports.append((pod, reason))

    def make_agent(reader: PodResourcesClient) -> NodeAgent:
        return NodeAgent("node-a", NAMES, backend, source, reader, encode_served, poll_s=0.2,
                         report_refusal=report, shares=shares)

    async def main() -> dict[str, str]:
        async with agent_on_fake_kubelet(make_agent) as node:
            for doc in pods.values():
                await node.kubelet.handle_pod_additions([fake_pod(doc)])
            await node.kubelet.wait_idle(30)
            await asyncio.sleep(0.05)
            return {p.name: p.phase for p in node.kubelet.pod_manager.values()}

    phases = asyncio.run(main())
    assert phases["whole"] == phases["by-compute"] == "Running"
    if shares:
        assert phases["slice"] == "Running" and not reports
    else:
        assert phases["slice"] == "Failed"
        [(pod, reason)] = reports
        assert pod == ("default", "slice") and WHOLE_CARDS_ONLY in reason


def test_the_node_publishes_its_notice_beside_the_inventory() -> None:
    backend = FakeGpuBackend.from_dict({"model": "T4", "cards": [{"uuid": "GPU-0", "memoryMiB": CARD}]})
    choice = choose_backend("auto", None, None)
    patch = node_patch(NAMES, backend.inventory(), enforcement_notice(choice, NoEnforcement(choice.reason)))
    text = patch["metadata"]["annotations"][NAMES.enforcement]
    assert '"shares":false' in text and NAMES.inventory in patch["metadata"]["annotations"]
