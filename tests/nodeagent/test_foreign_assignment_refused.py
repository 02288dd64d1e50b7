"""Allocate refuses an assignment decided for another pod (``assignment-v1``'s ``podUID``).

On v1.20-v1.22 the extender's Binding lands on whichever pod has the name, so a pod replaced
between the decision and the Binding arrives bound with its predecessor's cards. The agent grants
them to no other pod: Allocate fails (kubelet fails the pod with ``UnexpectedAdmissionError``, its
controller creates a new one) and the pod gets a Warning event naming both uids.
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
from gpupool.nodeagent.nvml.fake import FakeGpuBackend
from gpupool.nodeagent.schedule_check import AssignmentRefused, check_assignment
from gpupool.testing.fake_node import agent_on_fake_kubelet
from gpupool.testing.memory_pod_source import InMemoryPodSource
from tests.nodeagent.harness import NAMES, fake_pod
from tests.nodeagent.test_schedule_check import INVENTORY, view

CARD = 16384
STAMP = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


def pod_json(name: str, decided_for: str) -> dict[str, Any]:
    """Pod ``name`` (uid ``uid-<name>``) bound to node-a, asking 4 GiB, carrying an assignment of
    card 0 decided for ``decided_for`` ("" for a document written before ``podUID``)."""
    cards = (ContainerCards("main", (CardRef(0, "GPU-0", 4096, 0),)),)
    text = encode_assignment(Assignment("node-a", STAMP, cards, pod_uid=decided_for))
    return {"metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}",
                         "creationTimestamp": "2024-05-01T10:00:00Z", "annotations": {NAMES.assignment: text}},
            "spec": {"nodeName": "node-a",
                     "containers": [{"name": "main", "resources": {"limits": {NAMES.gpu_mem: "16"}}}]},
            "status": {"phase": "Pending"}}


def check(doc: dict[str, Any]) -> None:
    target = view(doc)
    assert target.assignment is not None
    container = target.assignment.container("main")
    assert container is not None
    check_assignment("node-a", INVENTORY, target, container, [])


@pytest.mark.parametrize("decided_for", [pytest.param("uid-p", id="its-own"),
                                         pytest.param("", id="written-before-podUID")])
def test_an_assignment_for_this_pod_is_granted(decided_for: str) -> None:
    check(pod_json("p", decided_for))


def test_an_assignment_for_another_pod_is_refused_naming_both_uids() -> None:
    with pytest.raises(AssignmentRefused, match="decided for pod uid uid-old, not this pod \\(uid uid-p\\)"):
        check(pod_json("p", "uid-old"))


@pytest.mark.slow
def test_kubelet_fails_the_replacement_at_admission_and_the_pod_is_told_why() -> None:
    own = pod_json("own", "uid-own")
    replaced = pod_json("replaced", "uid-of-its-predecessor")
    backend = FakeGpuBackend.from_dict({"model": "T4", "cards": [{"uuid": "GPU-0", "memoryMiB": CARD}]})
    source = InMemoryPodSource(NAMES)
    for doc in (own, replaced):
        source.put(doc)
    reports: list[tuple[tuple[str, str], str]] = []

    async def report(pod: tuple[str, str], reason: str) -> None:
        reports.append((pod, reason))

    def make_agent(reader: PodResourcesClient) -> NodeAgent:
        return NodeAgent("node-a", NAMES, backend, source, reader, encode_served, poll_s=0.2, report_refusal=report)

    async def main() -> None:
        async with agent_on_fake_kubelet(make_agent) as node:
            kubelet = node.kubelet
            await kubelet.handle_pod_additions([fake_pod(own)])
            await kubelet.handle_pod_additions([fake_pod(replaced)])
            await kubelet.wait_idle(30)
            await asyncio.sleep(0.05)
            phases = {p.name: (p.phase, p.reason) for p in kubelet.pod_manager.values()}
            assert phases["own"][0] == "Running"
            assert phases["replaced"][0] == "Failed"
            assert phases["replaced"][1].startswith("UnexpectedAdmissionError")
            assert node.agent.stats.refused == 1

    asyncio.run(main())
    [(pod, reason)] = reports
    assert pod == ("default", "replaced")
    assert "decided for pod uid uid-of-its-predecessor, not this pod (uid uid-replaced)" in reason
