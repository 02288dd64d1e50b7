"""A remote share against a real apiserver and kubelet: a pod on a node without GPUs is bound with
its share booked on another node's card, and that node's kubelet runs it.

The pod asks for ``gpupool.io/gpu-mem`` like any GPU pod; its node (a real kubelet, fake runtime)
advertises no gpupool resource, and kubelet drops extended resources its node does not advertise
from its admission, so the pod runs there (docs/remote-gpu.md, "Scheduling a remote share").
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.remote_share import decode_remote_share
from gpupool.core.model import GpuCard
from gpupool.core.remote_share import SWITCH_LABEL
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.kube.podapi import KubePodApi
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import NO_SCHEDULER, MakeNode, StartKubelet, pod_manifest, wait_for
from tests.e2e.trust_support import FlaggedExtender, scheduled_through

pytestmark = pytest.mark.e2e

REMOTE_SHARE = "gpupool.io/remote-share-v1"
ASSIGNMENT = "gpupool.io/assignment-v1"


def _nodes(core_v1: client.CoreV1Api, names: set[str]) -> list[dict[str, object]]:
    items = json.loads(core_v1.list_node(_preload_content=False).data)["items"]
    return [n for n in items if n["metadata"]["name"] in names]


def test_a_pod_on_a_node_without_gpus_runs_with_its_share_booked_on_another_nodes_card(
        core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, start_kubelet: StartKubelet) -> None:
    suffix = uuid.uuid4().hex[:6]
    gpu = f"e2e-gpu-{suffix}"
    card = GpuCard(index=0, uuid=f"GPU-{gpu}-0", model="Tesla-T4", memory_mib=15360)
    make_node(name=gpu, labels={SWITCH_LABEL: f"sw-{suffix}"},
              annotations={"gpupool.io/inventory-v1": encode_inventory(Inventory((card,)))})
    cpu = f"e2e-cpu-{suffix}"
    start_kubelet(cpu, labels={SWITCH_LABEL: f"sw-{suffix}"})

    cache = ClusterCache(policy="binpack")
    cache.replace_nodes(_nodes(core_v1, {gpu, cpu}))
    manifest = pod_manifest("remote", limits={"gpupool.io/gpu-mem": "16"}, scheduler_name=NO_SCHEDULER)
    manifest["metadata"]["annotations"] = {"gpupool.io/remote-gpu": "true"}
    created = core_v1.create_namespaced_pod(namespace, manifest)
    cache.replace_pods(json.loads(core_v1.list_namespaced_pod(namespace, _preload_content=False).data)["items"])

    result = Binder(cache, KubePodApi(core_v1)).bind(namespace, "remote", created.metadata.uid, cpu)
    assert result.ok, result.error

    running = wait_for(lambda: _running(core_v1, namespace, "remote"), timeout=60, what="remote pod Running")
    assert running.spec.node_name == cpu
    notes = running.metadata.annotations
    assert ASSIGNMENT not in notes
    share = decode_remote_share(notes[REMOTE_SHARE])
    assert (share.server, share.card.uuid, share.card.memory_mib, share.pod_uid) == (
        gpu, card.uuid, 16 * 256, created.metadata.uid)
    [usage] = cache.state.card_usage(gpu)
    assert usage.memory_free == 15360 - 4096

    # what the extender rebuilds after a restart: the share is booked from the pod object alone
    rebuilt = ClusterCache(policy="binpack")
    rebuilt.replace_nodes(_nodes(core_v1, {gpu, cpu}))
    rebuilt.replace_pods(json.loads(core_v1.list_namespaced_pod(namespace, _preload_content=False).data)["items"])
    [usage] = rebuilt.state.card_usage(gpu)
    assert usage.memory_free == 15360 - 4096


@pytest.fixture
def extender(control_plane: ControlPlane, tmp_path: Path) -> Iterator[FlaggedExtender]:
    """gpupool's extender, kube-scheduler calling it for gpupool's resources."""
    yield from scheduled_through(control_plane, FlaggedExtender(control_plane.kubeconfig, tmp_path / "extender.log"))


def test_kube_scheduler_and_the_extender_place_a_remote_share_pod_on_a_node_without_gpus(
        core_v1: client.CoreV1Api, namespace: str, make_node: MakeNode, start_kubelet: StartKubelet,
        extender: FlaggedExtender) -> None:
    """The whole path: kube-scheduler leaves gpu-mem to the extender (ignoredByScheduler), the
    extender's filter passes the node without GPUs, its bind writes the share, kubelet runs the pod.
    Then a pod of gpu-shared: 2: its slice booked on both cards of the GPU node."""
    suffix = uuid.uuid4().hex[:6]
    gpu = f"e2e-gpu-{suffix}"
    card, second = (GpuCard(index=i, uuid=f"GPU-{gpu}-{i}", model="Tesla-T4", memory_mib=15360) for i in range(2))
    make_node(name=gpu, labels={SWITCH_LABEL: f"sw-{suffix}"},
              annotations={"gpupool.io/inventory-v1": encode_inventory(Inventory((card, second)))})
    cpu = f"e2e-cpu-{suffix}"
    start_kubelet(cpu, labels={SWITCH_LABEL: f"sw-{suffix}", "gpupool.io/e2e-remote": suffix})
    manifest = pod_manifest("remote", limits={"gpupool.io/gpu-mem": "16"},
                            node_selector={"gpupool.io/e2e-remote": suffix})
    manifest["metadata"]["annotations"] = {"gpupool.io/remote-gpu": "true"}
    core_v1.create_namespaced_pod(namespace, manifest)

    running = wait_for(lambda: _running(core_v1, namespace, "remote"), timeout=90, what="remote pod Running")
    assert running.spec.node_name == cpu
    share = decode_remote_share(running.metadata.annotations[REMOTE_SHARE])
    assert (share.server, share.card.memory_mib) == (gpu, 4096) and share.more_cards == ()

    pair = pod_manifest("remote-pair", limits={"gpupool.io/gpu-shared": "2", "gpupool.io/gpu-mem": "8"},
                        node_selector={"gpupool.io/e2e-remote": suffix})
    pair["metadata"]["annotations"] = {"gpupool.io/remote-gpu": "true"}
    core_v1.create_namespaced_pod(namespace, pair)
    running = wait_for(lambda: _running(core_v1, namespace, "remote-pair"), timeout=90,
                       what="two-card remote pod Running")
    assert running.spec.node_name == cpu
    share = decode_remote_share(running.metadata.annotations[REMOTE_SHARE])
    assert share.server == gpu and sorted(c.uuid for c in share.cards) == [card.uuid, second.uuid]
    assert {c.memory_mib for c in share.cards} == {2048}


def _running(core_v1: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    pod = core_v1.read_namespaced_pod(name, namespace)
    return pod if pod.status.phase == "Running" else None
