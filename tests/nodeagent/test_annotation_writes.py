"""``allocated-v1`` writes of one pod never overtake each other: the last write is the newest."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Mapping
from typing import Any

import pytest

from gpupool.api.annotations import Assignment, encode_assignment
from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, NodeSpec, Placement
from gpupool.nodeagent.allocated_codec import served_resources
from tests.nodeagent.harness import NAMES, fake_pod, running_node

GPU_FILE = {"model": "Tesla-T4", "cards": [{"uuid": "GPU-0000", "memoryMiB": 16384}]}
#: The first write is slow (a busy apiserver), so the next one is sent while it is in flight.
SLOW_WRITE_S = 0.3


def pod_with_init_and_app() -> dict[str, Any]:
    spec = NodeSpec("node-a", cpu_milli=1000, memory_mib=1024, cards=(GpuCard(0, "GPU-0000", "Tesla-T4", 16384),))
    placement = Placement("default/p", "node-a", 0, 0, (ContainerAssignment("warmup", (CardSlice(0, 1024, 0),)),
                                                        ContainerAssignment("main", (CardSlice(0, 2048, 0),))))
    assignment = encode_assignment(Assignment.from_placement(placement, spec, dt.datetime(2024, 5, 1, tzinfo=dt.UTC)))
    return {"metadata": {"namespace": "default", "name": "p", "uid": "u1", "creationTimestamp": "2024-05-01T10:00:00Z",
                         "annotations": {NAMES.assignment: assignment}},
            "spec": {"nodeName": "node-a",
                     "initContainers": [{"name": "warmup", "resources": {"limits": {NAMES.gpu_mem: "4"}}}],
                     "containers": [{"name": "main", "resources": {"limits": {NAMES.gpu_mem: "8"}}}]},
            "status": {"phase": "Pending"}}


@pytest.mark.slow
def test_a_slow_older_write_does_not_land_after_a_newer_one() -> None:
    pod = pod_with_init_and_app()

    async def main() -> None:
        async with running_node(GPU_FILE, [pod]) as node:
            sent: list[set[str]] = []
            store = node.source.annotate

            async def slow_first(namespace: str, name: str, annotations: Mapping[str, str]) -> None:
                sent.append(set(served_resources(annotations[NAMES.allocated])))
                if len(sent) == 1:
                    await asyncio.sleep(SLOW_WRITE_S)
                await store(namespace, name, annotations)

            node.source.annotate = slow_first  # type: ignore[method-assign]
            await node.kubelet.handle_pod_additions([fake_pod(pod)])
            await node.kubelet.wait_idle(10)
            await node.agent.flush()  # what a shutdown or a test does: write everything now
            await asyncio.sleep(SLOW_WRITE_S * 2)
            assert sent[0] == {"warmup"}, sent  # the race this test is about did happen
            written = node.source.annotation("default", "p", NAMES.allocated)
            assert written is not None and set(served_resources(written)) == {"warmup", "main"}, sent

    asyncio.run(main())
