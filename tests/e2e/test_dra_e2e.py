"""gpupool's DRA driver end to end: kube-scheduler's DRA allocator + a real kubelet (fake runtime) +
``gpupool node-agent --dra``, on the default Kubernetes (v1.37.2: resource.k8s.io/v1 served and
DRAConsumableCapacity on by default, so the cluster needs no extra flags).

The agent publishes the node's one 8 GiB card in a ResourceSlice; the DeviceClass is the shipped one
(deploy/kustomize/components/dra). Two claims of 4 GiB are allocated on that card by kube-scheduler
(consumable capacity), kubelet calls NodePrepareResources and the agent writes each claim's CDI spec
with the grant an Allocate would give (4096 MiB on that card). A third 4 GiB claim finds no capacity
left and its pod stays Pending with the scheduler's reason. A restarted agent still knows the
prepared claims: when a pod is deleted, kubelet's NodeUnprepareResources reaches the new agent,
which removes that claim's CDI spec and forgets it; a restarted kubelet finds the agent's socket
again and unprepares the other claim through it.

The fake runtime does not apply CDI specs, so what a container sees is checked in the spec files,
not in its environment (docs/dra.md says what is proven and what is not).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.environment import ContainerEnvironment
from tests.e2e.dra_support import (
    DRIVER,
    cdi_env,
    checkpoint_uids,
    claim_manifest,
    claim_pod,
    dra_installed,
    node_slice,
)
from tests.e2e.e2e_support import NodeAgentProcess, StartKubelet, condition, wait_for

pytestmark = pytest.mark.e2e

CARD_UUID = "GPU-dra-e2e-0000"
GPUS = f"""\
model: Tesla-T4
cards:
  - {{uuid: {CARD_UUID}, memoryMiB: 8192}}
"""


def test_two_4gib_claims_share_one_card_prepared_by_the_agent(
        kube_api_client: client.ApiClient, core_v1: client.CoreV1Api, namespace: str,
        start_kubelet: StartKubelet, start_node_agent: Any, tmp_path: Path) -> None:
    node = f"dra-{uuid.uuid4().hex[:6]}"
    kubelet = start_kubelet(node)
    cdi_dir = tmp_path / "cdi"
    args = ("--dra", "--dra-kubelet-dir", str(kubelet.root_dir), "--cdi-dir", str(cdi_dir))
    agent: NodeAgentProcess = start_node_agent(kubelet, GPUS, extra_args=args)
    checkpoint = kubelet.root_dir / "plugins" / DRIVER / "prepared-claims.json"
    with dra_installed(kube_api_client, node) as resource:
        began = time.monotonic()

        def took(what: str) -> None:
            print(f"\n  {what}: {time.monotonic() - began:.1f} s after the agent started", flush=True)

        published = wait_for(lambda: node_slice(kube_api_client, node), timeout=60, what="the agent's ResourceSlice")
        took("slice published")
        (device,) = published["spec"]["devices"]
        assert (published["spec"]["driver"], device["name"], device["allowMultipleAllocations"]) == (
            DRIVER, "gpu-0", True)
        assert device["capacity"]["memory"]["value"] == "8Gi"

        for name in ("a", "b", "c"):
            resource.create_namespaced_resource_claim(namespace, claim_manifest(f"claim-{name}", "4Gi"))
        for name in ("a", "b"):
            core_v1.create_namespaced_pod(namespace, claim_pod(f"pod-{name}", f"claim-{name}", node))

        def running(pod: str) -> bool:
            return core_v1.read_namespaced_pod(pod, namespace).status.phase == "Running"

        for pod in ("pod-a", "pod-b"):
            wait_for(lambda pod=pod: running(pod), timeout=90, what=f"{pod} Running ({agent.log_path})")
        took("both claim pods Running")
        uids = {}
        for name in ("a", "b"):
            claim = kube_api_client.sanitize_for_serialization(
                resource.read_namespaced_resource_claim(f"claim-{name}", namespace))
            (res,) = claim["status"]["allocation"]["devices"]["results"]
            assert (res["driver"], res["pool"], res["device"]) == (DRIVER, node, "gpu-0")
            assert res["consumedCapacity"]["memory"] == "4Gi"
            uid = claim["metadata"]["uid"]
            uids[name] = uid
            env = wait_for(lambda uid=uid: cdi_env(cdi_dir, uid), timeout=30, what=f"claim-{name}'s CDI spec")
            grant = ContainerEnvironment.from_env(env)
            assert [(c.index, c.uuid, c.memory_mib) for c in grant.cards] == [(0, CARD_UUID, 4096)]
            assert grant.pod == f"{namespace}/pod-{name}"
        assert checkpoint_uids(checkpoint) == set(uids.values())

        # the card is full: a third 4 GiB claim waits, with kube-scheduler's reason
        core_v1.create_namespaced_pod(namespace, claim_pod("pod-c", "claim-c", node))

        def unschedulable(pod: str) -> Any:
            cond = condition(core_v1.read_namespaced_pod(pod, namespace), "PodScheduled")
            return cond if cond is not None and cond.status == "False" else None

        cond = wait_for(lambda: unschedulable("pod-c"), timeout=60, what="pod-c unschedulable")
        took("third pod Unschedulable")
        assert cond.reason == "Unschedulable" and "cannot allocate all claims" in cond.message, cond.message

        # bad claims wait with the scheduler's reason: more than any card has, an unknown class
        resource.create_namespaced_resource_claim(namespace, claim_manifest("claim-huge", "100Gi"))
        unknown = claim_manifest("claim-unknown", "1Gi")
        unknown["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nope.gpupool.io"
        resource.create_namespaced_resource_claim(namespace, unknown)
        for pod, claim in (("pod-huge", "claim-huge"), ("pod-unknown", "claim-unknown")):
            core_v1.create_namespaced_pod(namespace, claim_pod(pod, claim, node))
        cond = wait_for(lambda: unschedulable("pod-huge"), timeout=60, what="pod-huge unschedulable")
        assert "cannot allocate all claims" in cond.message, cond.message
        cond = wait_for(lambda: unschedulable("pod-unknown"), timeout=60, what="pod-unknown unschedulable")
        assert "device class nope.gpupool.io does not exist" in cond.message, cond.message
        assert checkpoint_uids(checkpoint) == set(uids.values())  # nothing of theirs reached the node

        # an agent restart keeps the prepared claims: the new agent unprepares what the old one prepared
        agent.stop()
        agent.start()
        core_v1.delete_namespaced_pod("pod-a", namespace, grace_period_seconds=0)
        wait_for(lambda: cdi_env(cdi_dir, uids["a"]) is None, timeout=60,
                 what=f"claim-a's CDI spec removed by kubelet's unprepare ({agent.log_path})")
        took("claim-a unprepared by the restarted agent")
        assert checkpoint_uids(checkpoint) == {uids["b"]}
        assert cdi_env(cdi_dir, uids["b"]) is not None

        # a kubelet restart: kubelet finds the registration socket again and unprepares through it
        kubelet.restart()
        core_v1.delete_namespaced_pod("pod-b", namespace, grace_period_seconds=0)
        # kubelet v1.37 unprepares this one from its DRA manager's reconcile loop, which runs every
        # 60 s (measured once: 59.9 s after the deletion), not from the pod's termination
        wait_for(lambda: cdi_env(cdi_dir, uids["b"]) is None, timeout=120,
                 what=f"claim-b's CDI spec removed after a kubelet restart ({agent.log_path})")
        took("claim-b unprepared after the kubelet restart")
        assert checkpoint_uids(checkpoint) == set()
        assert agent.running()
