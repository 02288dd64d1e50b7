"""A node migrated from HAMi without draining: the HAMi pod already running there keeps its memory.

The pod is created bound (``spec.nodeName``) with the annotations HAMi's scheduler writes
(``hami.io/vgpu-devices-allocated`` naming the card by UUID and 12,000 MiB, ``hami.io/vgpu-node``),
and no ``assignment-v1``; the node (an API object without a kubelet) publishes one 16,384 MiB card.
Through the real kube-scheduler and ``gpupool extender``: an 8 GiB pod is never bound (only
4,384 MiB are left on the card), a 4 GiB pod is bound to the node, and once the HAMi pod is deleted
the 8 GiB pod is bound too (the extender's requeue wakes it).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.annotations import Inventory, decode_assignment, encode_inventory
from gpupool.api.names import NVIDIA_GPU, NVIDIA_GPUMEM, ResourceNames
from gpupool.core.model import GpuCard
from tests.e2e.e2e_support import ExtenderProcess, MakeNode, condition, wait_for

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
CARD_MIB = 16384


def gpu_pod(name: str, mib: int, node: str, *, bound: bool = False,
            annotations: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {NVIDIA_GPUMEM: str(mib), **({NVIDIA_GPU: "1"} if bound else {})}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox",
                                            "resources": {"limits": limits, "requests": {"cpu": "10m"}}}],
                            "terminationGracePeriodSeconds": 0}
    spec.update({"nodeName": node} if bound else {"nodeSelector": {"kubernetes.io/hostname": node}})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
            "spec": spec}


def test_a_running_hami_pods_card_gives_gpupool_only_what_is_left(
    core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, gpupool_extender: ExtenderProcess
) -> None:
    node = f"hami-{uuid.uuid4().hex[:6]}"
    card = GpuCard(0, f"GPU-{uuid.uuid4()}", "Tesla-V100", CARD_MIB)
    make_node(node, {"cpu": "64", "memory": "256Gi", "pods": "250", NVIDIA_GPUMEM: "1"},
              annotations={NAMES.inventory: encode_inventory(Inventory((card,)))})
    core_v1.create_namespaced_pod(namespace, gpu_pod(
        "hami-running", 12000, node, bound=True,
        annotations={"hami.io/vgpu-devices-allocated": f"{card.uuid},NVIDIA,12000,0:;",
                     "hami.io/vgpu-node": node, "hami.io/bind-phase": "success"}))
    probe = {"metadata": {"name": "probe", "namespace": "default", "uid": "probe"},
             "spec": {"containers": [{"name": "main", "resources": {"limits": {NVIDIA_GPUMEM: "4385"}}}]}}
    wait_for(lambda: gpupool_extender.passes(probe, [node]) == [] or None, timeout=30,
             what="the extender to book the HAMi pod's 12,000 MiB")

    core_v1.create_namespaced_pod(namespace, gpu_pod("want-8g", 8192, node))
    core_v1.create_namespaced_pod(namespace, gpu_pod("want-4g", 4096, node))

    def bound(name: str) -> str | None:
        found: str | None = core_v1.read_namespaced_pod(name, namespace).spec.node_name
        return found

    assert wait_for(lambda: bound("want-4g"), timeout=60, what="the 4 GiB pod bound") == node
    placed = core_v1.read_namespaced_pod("want-4g", namespace)
    assignment = decode_assignment(placed.metadata.annotations[NAMES.assignment])
    assert [(c.uuid, c.memory_mib) for c in assignment.containers[0].cards] == [(card.uuid, 4096)]

    def refused() -> Any:
        scheduled = condition(core_v1.read_namespaced_pod("want-8g", namespace), "PodScheduled")
        return scheduled if scheduled is not None and scheduled.status == "False" else None

    assert wait_for(refused, timeout=60, what="the 8 GiB pod refused").reason == "Unschedulable"
    assert bound("want-8g") is None

    core_v1.delete_namespaced_pod("hami-running", namespace, grace_period_seconds=0)
    core_v1.delete_namespaced_pod("want-4g", namespace, grace_period_seconds=0)
    assert wait_for(lambda: bound("want-8g"), timeout=90, what="the 8 GiB pod bound once HAMi's pod left") == node
