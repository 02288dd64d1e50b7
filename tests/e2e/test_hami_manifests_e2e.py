"""HAMi and gpushare manifests, unchanged, through the real kube-scheduler and admitted by a real kubelet.

``gpupool extender --hami`` reads ``nvidia.com/gpu`` as HAMi's card count; kube-scheduler calls it
for HAMi's names (all ``ignoredByScheduler``); ``gpupool node-agent --serve-aliases hami,gpushare``
registers ``nvidia.com/gpu`` (and ``aliyun.com/gpu-mem``) with the kubelet. HAMi's memory, compute
and priority names are not kubelet devices: kubelet 1.20 drops them from an app container's
admission and calls Allocate for ``nvidia.com/gpu`` only, and the agent hands the assignment's
cards. A manifest that names HAMi's memory without ``nvidia.com/gpu`` (HAMi's webhook added it)
stays Pending with the reason.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from gpupool.api import names as n
from gpupool.api.annotations import decode_allocated, decode_assignment, decode_inventory
from gpupool.api.names import ResourceNames
from gpupool.testenv.config import ExtenderConfig
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import (
    GRANT_KEYS,
    ContainerLimits,
    ExtenderProcess,
    NodeAgentProcess,
    StartKubelet,
    expected_grant,
    gpu_pod_manifest,
    wait_for,
)
from tests.e2e.test_gpu_pod_e2e import container_env, running, unschedulable

pytestmark = pytest.mark.e2e

HAMI = ResourceNames(hami=True)
CARD_MIB = 16384
CARDS = 3
GPUS = f"""\
model: Tesla-T4
cards:
  - {{uuid: GPU-hami-0000, memoryMiB: {CARD_MIB}}}
  - {{uuid: GPU-hami-0001, memoryMiB: {CARD_MIB}}}
  - {{uuid: GPU-hami-0002, memoryMiB: {CARD_MIB}}}
"""
HAMI_DEVICES_PER_CARD = CARD_MIB // 256 + 200


@pytest.fixture(scope="module")
def hami_extender(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExtenderProcess]:
    extender = ExtenderProcess(control_plane.kubeconfig, tmp_path_factory.mktemp("hami") / "extender.log",
                               extra_args=("--hami",))
    extender.start()
    control_plane.restart_scheduler([
        ExtenderConfig(url_prefix=extender.url, filter_verb="filter", prioritize_verb="prioritize",
                       bind_verb="bind", weight=5, node_cache_capable=True,
                       managed_resources=HAMI.managed(), http_timeout_s=10.0)])
    try:
        yield extender
    finally:
        extender.kill()
        control_plane.restart_scheduler([])


def manifest(name: str, limits: dict[str, str], node: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    pod = gpu_pod_manifest(name, [("main", limits)], node=node)
    pod["metadata"]["labels"] = labels or {}
    return pod


def test_hami_and_gpushare_manifests_run_with_their_cards(
    core_v1: client.CoreV1Api, namespace: str, start_kubelet: StartKubelet,
    start_node_agent: Callable[..., NodeAgentProcess], hami_extender: ExtenderProcess,
) -> None:
    node = f"e2e-h-{uuid.uuid4().hex[:6]}"  # short: the plugin socket paths must fit 108 bytes
    kubelet = start_kubelet(node)
    agent = start_node_agent(kubelet, GPUS, ("--serve-aliases", "hami,gpushare"))

    def ready() -> bool:
        assert agent.running(), agent.log()
        got = core_v1.read_node(node)
        allocatable = got.status.allocatable or {}
        text = (got.metadata.annotations or {}).get(HAMI.inventory)
        return (allocatable.get(n.NVIDIA_GPU) == str(CARDS * HAMI_DEVICES_PER_CARD)
                and allocatable.get(n.ALIYUN_GPU_MEM) == str(CARDS * CARD_MIB // 1024)
                and allocatable.get(n.ALIYUN_GPU_COUNT) == str(CARDS)  # gpushare's card count
                and n.NVIDIA_GPUMEM not in allocatable
                and text is not None and len(decode_inventory(text).cards) == CARDS)

    wait_for(ready, timeout=60, what=f"nvidia.com/gpu devices on {node}:\n{agent.log()}")

    # What each manifest must get per card: (cards, MiB, compute per-mille, exclusive).
    pods: dict[str, tuple[dict[str, str], dict[str, str], tuple[int, int, int, bool]]] = {
        "hami-whole": ({n.NVIDIA_GPU: "1"}, {}, (1, CARD_MIB, 1000, True)),
        "hami-slice": ({n.NVIDIA_GPU: "1", n.NVIDIA_GPUMEM: "3000", n.NVIDIA_GPUCORES: "30"}, {},
                       (1, 3000, 300, False)),
        "hami-percent": ({n.NVIDIA_GPU: "2", n.NVIDIA_GPUMEM_PERCENTAGE: "25", n.NVIDIA_PRIORITY: "1"}, {},
                         (2, CARD_MIB // 4, 0, False)),
        "cgpu-two-cards": ({n.ALIYUN_GPU_MEM: "4"}, {n.ALIYUN_GPU_COUNT: "2"}, (2, 2048, 0, False)),
    }
    created = time.monotonic()
    for name, (limits, labels, _) in pods.items():
        core_v1.create_namespaced_pod(namespace, manifest(name, limits, node, labels=labels))
    for name in pods:
        wait_for(lambda n_=name: running(core_v1, namespace, n_), timeout=90, what=f"{name} Running\n{agent.log()}")
    print(f"\nHAMi/gpushare pods created -> Running: {time.monotonic() - created:.1f} s")

    for name, (_limits, _labels, (count, mib, compute, exclusive)) in pods.items():
        pod = core_v1.read_namespaced_pod(name, namespace)
        [entry] = decode_assignment(pod.metadata.annotations[HAMI.assignment]).containers
        assert [(c.memory_mib, c.compute, c.exclusive) for c in entry.cards] == [(mib, compute, exclusive)] * count
        env = container_env(core_v1, namespace, name, "main")
        assert {k: env.get(k) for k in GRANT_KEYS} == expected_grant(namespace, name, "main", entry.cards), name

        def allocated(pod_name: str = name) -> Any:
            text = (core_v1.read_namespaced_pod(pod_name, namespace).metadata.annotations or {}).get(HAMI.allocated)
            return decode_allocated(text) if text else None

        [served] = wait_for(allocated, timeout=30, what=f"allocated-v1 on {name}").containers
        assert [r.index for r in served.cards] == [c.index for c in entry.cards]
    whole = decode_assignment(core_v1.read_namespaced_pod("hami-whole", namespace)
                              .metadata.annotations[HAMI.assignment]).containers[0].cards[0].index
    sliced = {c.index for name in pods if name != "hami-whole"
              for c in decode_assignment(core_v1.read_namespaced_pod(name, namespace)
                                         .metadata.annotations[HAMI.assignment]).containers[0].cards}
    assert whole not in sliced

    # HAMi's memory without its card count: kubelet would start it without a grant; the extender says so.
    lone: list[ContainerLimits] = [("main", {n.NVIDIA_GPUMEM: "1000"})]
    core_v1.create_namespaced_pod(namespace, gpu_pod_manifest("hami-no-count", lone, node=node))
    message = wait_for(lambda: unschedulable(core_v1, namespace, "hami-no-count"), timeout=60,
                       what="hami-no-count marked unschedulable")
    assert "needs nvidia.com/gpu beside it" in message, message
    # kubelet's status updates since the start kept gpushare's card count (no device plugin owns it)
    status = core_v1.read_node(node).status
    assert (status.capacity or {}).get(n.ALIYUN_GPU_COUNT) == str(CARDS)
    assert (status.allocatable or {}).get(n.ALIYUN_GPU_COUNT) == str(CARDS)
