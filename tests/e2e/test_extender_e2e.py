"""gpupool's extender behind the real kube-scheduler and kube-apiserver (v1.37.2, from the testenv).

The extender runs as its own process (``gpupool extender``), exactly as deployed, so that one test
can kill it in the middle of 200 bindings and start it again. Nodes are API objects without a
kubelet (their GPUs are described by the ``inventory-v1`` annotation), so pods end *bound*
(``spec.nodeName`` set), which is all the scheduler side decides.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.annotations import Inventory, decode_assignment, encode_inventory
from gpupool.api.names import NVIDIA_GPUMEM, ResourceNames
from gpupool.core.model import GpuCard
from tests.e2e.e2e_support import ExtenderProcess, MakeNode

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()


NodeFactory = Callable[..., str]


@pytest.fixture
def gpu_node(make_node: MakeNode) -> NodeFactory:
    """Kubelet-less Nodes publishing ``inventory-v1``; deleted after the test by ``make_node``.

    They advertise HAMi's MiB alias, which the pods here use to ask exact MiB (the Alibaba
    example's cards are not multiples of 256 MiB): the extender sends a pod that uses an alias only
    to nodes whose kubelet lists it, as a node whose device plugin served it would."""

    def make(card_mib: list[int], name: str | None = None) -> str:
        node_name = name or f"gpu-{uuid.uuid4().hex[:6]}"
        cards = tuple(GpuCard(i, f"GPU-{node_name}-{i}", "Tesla-P100", m) for i, m in enumerate(card_mib))
        return make_node(node_name, {"cpu": "64", "memory": "256Gi", "pods": "250", NVIDIA_GPUMEM: "1"},
                         annotations={NAMES.inventory: encode_inventory(Inventory(cards))})

    return make


def gpu_pod(
    name: str,
    mib: int | None,
    *,
    node_selector: str | None = None,
    node_name: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    # MiB per card through the HAMi alias: the scenarios use card sizes that are not multiples of
    # gpupool.io/gpu-mem's 256 MiB unit.
    limits = {NVIDIA_GPUMEM: str(mib)} if mib is not None else {}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "busybox", "resources": {"limits": limits, "requests": {"cpu": "10m"}}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if node_selector:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node_selector}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }


def wait_bound(
    core_v1: client.CoreV1Api, namespace: str, names: list[str], timeout: float = 120
) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    bound: dict[str, str] = {}
    while time.monotonic() < deadline:
        for p in core_v1.list_namespaced_pod(namespace).items:
            if p.metadata.name in names and p.spec.node_name:
                bound[p.metadata.name] = p.spec.node_name
        if len(bound) == len(names):
            return bound
        time.sleep(0.5)
    missing = sorted(set(names) - set(bound))
    raise AssertionError(f"{len(missing)} pods never bound, e.g. {missing[:5]}")


def assignments(core_v1: client.CoreV1Api, namespace: str) -> dict[str, Any]:
    result = {}
    for p in core_v1.list_namespaced_pod(namespace).items:
        text = (p.metadata.annotations or {}).get(NAMES.assignment)
        if text:
            result[p.metadata.name] = decode_assignment(text)
    return result


def test_pods_without_gpu_never_reach_the_extender(
    core_v1: client.CoreV1Api, namespace: str, gpu_node: NodeFactory, gpupool_extender: ExtenderProcess
) -> None:
    gpu_node([16276])
    before = gpupool_extender.metric("gpupool_extender_requests_total", outcome="ok", verb="filter")
    core_v1.create_namespaced_pod(namespace, gpu_pod("plain", None))
    wait_bound(core_v1, namespace, ["plain"])
    core_v1.create_namespaced_pod(namespace, gpu_pod("shared", 1000))
    wait_bound(core_v1, namespace, ["shared"])
    after = gpupool_extender.metric("gpupool_extender_requests_total", outcome="ok", verb="filter")
    assert after == before + 1  # only the GPU pod was filtered by the extender
    assert set(assignments(core_v1, namespace)) == {"shared"}


def placed_pod(name: str, node: str, card: int, mib: int) -> dict[str, Any]:
    """A pod bound directly to ``node`` with its recorded assignment (as an earlier bind leaves it)."""
    note = json.dumps(
        {
            "v": 1,
            "node": node,
            "time": "2024-05-01T00:00:00Z",
            "containers": [
                {
                    "name": "main",
                    "init": False,
                    "cards": [
                        {
                            "index": card,
                            "uuid": f"GPU-{node}-{card}",
                            "memoryMiB": mib,
                            "computeMilli": 0,
                            "exclusive": False,
                        }
                    ],
                }
            ],
        }
    )
    return gpu_pod(name, mib, node_name=node, annotations={NAMES.assignment: note})


def wait_booked(extender: ExtenderProcess, nodes: list[str], probe: dict[str, Any], timeout: float = 20) -> None:
    """Until the extender's ledger holds the pods placed on ``nodes``: ``probe``, a pod that fits on
    each node only while some of them are not booked yet, passes the filter on none of them.

    (The ledger's per-card series moved to the node agents, which these kubelet-less nodes lack.)"""
    deadline = time.monotonic() + timeout
    passed = nodes
    while time.monotonic() < deadline:
        passed = extender.passes(probe, nodes)
        if not passed:
            return
        time.sleep(0.2)
    raise AssertionError(f"the extender still fits {probe['metadata']['name']} on {passed}")


def probe_pod(limits: dict[str, str]) -> dict[str, Any]:
    """A pod that is never created, only shown to the extender's filter."""
    return {"metadata": {"name": "probe", "namespace": "default", "uid": "probe"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}


def test_alibaba_example_lands_on_n3_gpu0(
    core_v1: client.CoreV1Api, namespace: str, gpu_node: NodeFactory, gpupool_extender: ExtenderProcess
) -> None:
    """Three nodes with two 16,276 MiB cards, used as in the design note: N1 has 4,069 MiB free in
    all, N2 4,069 on each card, N3 8,138 on GPU0. An 8,138 MiB pod can only go to N3 GPU0."""
    tag = uuid.uuid4().hex[:4]
    n1, n2, n3 = (gpu_node([16276, 16276], f"n{i}-{tag}") for i in (1, 2, 3))
    used = [(n1, 0, 16276), (n1, 1, 12207), (n2, 0, 12207), (n2, 1, 12207), (n3, 0, 8138), (n3, 1, 16276)]
    for i, (node, card, mib) in enumerate(used):
        core_v1.create_namespaced_pod(namespace, placed_pod(f"used{i}", node, card, mib))
    # 8,139 MiB fit on a node until both of its cards are booked (each keeps less free once booked)
    wait_booked(gpupool_extender, [n1, n2, n3], probe_pod({NVIDIA_GPUMEM: "8139"}))
    core_v1.create_namespaced_pod(namespace, gpu_pod("want-8138", 8138))
    assert wait_bound(core_v1, namespace, ["want-8138"])["want-8138"] == n3
    a = assignments(core_v1, namespace)["want-8138"]
    assert (a.node, a.containers[0].cards[0].index, a.containers[0].cards[0].memory_mib) == (n3, 0, 8138)


def test_binpack_picks_gpu1(
    core_v1: client.CoreV1Api, namespace: str, gpu_node: NodeFactory, gpupool_extender: ExtenderProcess
) -> None:
    """Cards with 12,207 / 8,138 / 4,069 / 16,276 MiB free: an 8,138 MiB pod goes to GPU1."""
    node = gpu_node([16276] * 4)
    for card, mib in enumerate([4069, 8138, 12207]):
        core_v1.create_namespaced_pod(namespace, placed_pod(f"used{card}", node, card, mib))
    # two idle cards are left until all three pods are booked
    wait_booked(gpupool_extender, [node], probe_pod({NAMES.gpu: "2"}))
    core_v1.create_namespaced_pod(namespace, gpu_pod("binpack", 8138, node_selector=node))
    wait_bound(core_v1, namespace, ["binpack"])
    assert assignments(core_v1, namespace)["binpack"].containers[0].cards[0].index == 1


def test_200_pods_with_an_extender_restart_never_over_commit(
    core_v1: client.CoreV1Api, namespace: str, gpu_node: NodeFactory, gpupool_extender: ExtenderProcess
) -> None:
    card_mib = 16276
    nodes = [gpu_node([card_mib] * 4) for _ in range(10)]
    sizes = [1024, 2048, 3072, 4069]
    names = [f"p{i:03d}" for i in range(200)]
    total = sum(sizes[i % 4] for i in range(200))
    assert total < 0.8 * card_mib * 4 * len(nodes)
    for i, name in enumerate(names):
        core_v1.create_namespaced_pod(namespace, gpu_pod(name, sizes[i % 4]))
    # Kill the extender once some pods are bound, keep it down a moment, start it again.
    deadline = time.monotonic() + 60
    bound_at_kill = 0
    while time.monotonic() < deadline:
        bound_at_kill = sum(1 for p in core_v1.list_namespaced_pod(namespace).items if p.spec.node_name)
        if bound_at_kill >= 40:
            break
        time.sleep(0.2)
    assert 40 <= bound_at_kill < len(names), bound_at_kill  # the kill lands in the middle
    gpupool_extender.kill()
    time.sleep(2.0)
    gpupool_extender.start()
    bound = wait_bound(core_v1, namespace, names, timeout=240)
    assert set(bound) == set(names)
    used: dict[tuple[str, int], int] = defaultdict(int)
    found = assignments(core_v1, namespace)
    assert set(found) == set(names)
    for name, a in found.items():
        assert a.node == bound[name], name
        for ref in a.containers[0].cards:
            used[(a.node, ref.index)] += ref.memory_mib
    assert set(n for n, _ in used) <= set(nodes)
    over = {k: v for k, v in used.items() if v > card_mib}
    assert not over, over
