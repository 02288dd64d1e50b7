"""Lending with DRA claims on a real kubelet: a claim's pod is an owner like an extended-resource pod.

A real kubelet with containerd and runc (CDI on), kube-scheduler's DRA allocator, and
``gpupool node-agent --dra --lending`` on one stand-in card of 16 GiB (a character device the host
and the containers open alike, put in the claim's container by the agent's CDI spec).

1. The owner pod gets 12 GiB of the card by a ResourceClaim (no extended resource), opens the card
   and computes nothing: the monitor calls it idle after ``--idle-after`` and the agent lends it
   (``gpupool.io/lendable`` on the Node names the claim's pod as the owner). A borrower asking 8 GiB
   by extended resource, bound by hand on the loan (the marks the extender would write), is vouched
   by Allocate and runs ``examples/checkpoint_worker.sh`` holding the card beside its idle owner.
   The owner opens the card again: the borrower's processes are stopped (it writes its checkpoint),
   it is evicted with a ``GpuReclaimed`` event and the loan is withdrawn; the owner keeps running.
2. A prepared claim whose pod's container never opens the card (4 GiB, 30 %) is never lent: the
   loan of the idle claim owner beside it leaves the claim's memory and compute out.

The node-level cases (the driver's claim state, no kubelet) are tests/nodeagent/lending/test_dra_claims.py.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from bench.reclaim import BORROWER_MIB, CARD_MIB, OWNER, TARGET_S, WORKER, assignment, one_card, pod
from gpupool.api.lending import RECLAIMED_REASON, LendingNames
from gpupool.api.names import ResourceNames
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.kubelet import Kubelet
from tests.e2e import real_containers
from tests.e2e.dra_support import DRIVER, claim_manifest, claim_pod, containerd_dra_args, dra_installed, node_slice
from tests.e2e.e2e_support import NodeAgentProcess, pod_gone, wait_for
from tests.e2e.test_lending_loop_e2e import allocatable, container_id, holders, lent, running, who_holds

# Slow: a real kubelet, DRA and two pod starts per case (about a minute each).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

NAMES, LEND = ResourceNames(), LendingNames()
EVICTED_S = 3.0
"""Bound on the reclaimed borrower's pod being gone after the loan is withdrawn (as the lending loop's)."""
LENDING_ARGS = ("--lending", "--idle-after", "2s", "--checkpoint-deadline", "2", "--lease-namespace", "")


def claim(name: str, memory: str, compute: int | None = None) -> dict[str, Any]:
    """A ResourceClaim for ``memory`` (and ``compute`` percent, when given) of one gpupool card."""
    manifest = claim_manifest(name, memory)
    if compute is not None:
        (request,) = manifest["spec"]["devices"]["requests"]
        request["exactly"]["capacity"]["requests"]["compute"] = str(compute)
    return manifest


def claim_owner(name: str, claim_name: str, node: str, image: str, card: str, trigger: Path) -> dict[str, Any]:
    """A pod whose container uses ``claim_name`` and runs the lending bench's owner: it holds ``card``
    without computing and opens it again at each trigger file."""
    manifest = claim_pod(name, claim_name, node, image, ("sh", "-c", OWNER))
    spec = manifest["spec"]
    spec["volumes"] = [{"name": "trigger", "hostPath": {"path": str(trigger)}}]
    (container,) = spec["containers"]
    container["env"] = [{"name": "CARD", "value": card}]
    container["volumeMounts"] = [{"name": "trigger", "mountPath": "/trigger"}]
    return manifest


def allocated_card(api: client.ApiClient, resource: client.ResourceV1Api, namespace: str, name: str) -> int:
    """The card the DRA allocator gave the claim ``name``."""
    found = api.sanitize_for_serialization(resource.read_namespaced_resource_claim(name, namespace))
    (result,) = found["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER, result
    return int(result["device"].removeprefix("gpu-"))


def start_agent(start_node_agent: Any, kubelet: Kubelet, tmp_path: Path) -> NodeAgentProcess:
    """The agent with ``--dra --lending`` on one 16 GiB stand-in card, its ResourceSlice and the
    card's extended-resource devices published."""
    agent: NodeAgentProcess = start_node_agent(kubelet, one_card(tmp_path / "dev"), extra_args=(
        *containerd_dra_args(kubelet), *LENDING_ARGS, "--checkpoint-dir", str(tmp_path / "ckpt")))
    return agent


def why_pending(core_v1: client.CoreV1Api, api: client.ApiClient, namespace: str, name: str, claim_name: str) -> str:
    """The pod's phase and events and its claim's status, for a time-out's message."""
    phase = core_v1.read_namespaced_pod(name, namespace).status.phase
    events = [f"{e.reason}: {e.message}" for e in core_v1.list_namespaced_event(namespace).items
              if e.involved_object.name in (name, claim_name)]
    status = api.sanitize_for_serialization(
        client.ResourceV1Api(api).read_namespaced_resource_claim(claim_name, namespace)).get("status")
    return f"{name} {phase}; events {events}; claim status {status}"


@pytest.fixture
def claim_controller(control_plane: ControlPlane) -> Iterator[None]:
    """The resourceclaim controller: it deallocates a claim whose pods are gone, so the next case's
    claims find the card's capacity (the scheduler counts an allocated claim until then)."""
    control_plane.start_controllers(("resourceclaim-controller",))
    try:
        yield
    finally:
        control_plane.stop_controllers()


def cleared(core_v1: client.CoreV1Api, resource: client.ResourceV1Api, namespace: str, agent: NodeAgentProcess,
            card: str, *names: str) -> None:
    """Delete the case's pods and claims; wait until the claims are deallocated and gone and none of
    the pods' processes holds the card (the next case's card has the same device numbers: its agent
    must not find these containers on it). Graceful, so kubelet unprepares a claim before its pod goes."""
    for name in names:
        with contextlib.suppress(client.ApiException):
            core_v1.delete_namespaced_pod(name, namespace, grace_period_seconds=1)
    for item in resource.list_namespaced_resource_claim(namespace).items:
        with contextlib.suppress(client.ApiException):
            resource.delete_namespaced_resource_claim(item.metadata.name, namespace)
    wait_for(lambda: not resource.list_namespaced_resource_claim(namespace).items, timeout=60,
             what="the case's claims deallocated and deleted")
    if agent.running():
        wait_for(lambda: not holders(agent, card) or None, timeout=60, what="the case's containers gone",
                 explain=lambda: who_holds(agent, card))


def test_an_idle_claim_owner_lends_its_card_and_its_open_reclaims_the_borrower(
        containerd_kubelet: Kubelet, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
        namespace: str, start_node_agent: Any, tmp_path: Path, claim_controller: None) -> None:
    kubelet = containerd_kubelet
    node, image = kubelet.node_name, kubelet.images.busybox.ref
    card, trigger = f"{tmp_path / 'dev'}/nvidia0", tmp_path / "trigger"
    trigger.mkdir()
    agent = start_agent(start_node_agent, kubelet, tmp_path)
    with dra_installed(kube_api_client, node) as resource:
        try:
            wait_for(lambda: node_slice(kube_api_client, node), timeout=60,
                     what=f"the agent's ResourceSlice\n{agent.log()}")
            wait_for(lambda: allocatable(core_v1, node) == CARD_MIB // 256 or None, timeout=60,
                     what=f"the card's devices on {node}\n{agent.log()}")
            resource.create_namespaced_resource_claim(namespace, claim("owner-claim", "12Gi"))
            core_v1.create_namespaced_pod(namespace, claim_owner("owner", "owner-claim", node, image, card, trigger))
            wait_for(lambda: running(core_v1, namespace, "owner"), timeout=120,
                     what=f"the claim owner Running\n{agent.log()}",
                     explain=lambda: why_pending(core_v1, kube_api_client, namespace, "owner", "owner-claim"))
            assert allocated_card(kube_api_client, resource, namespace, "owner-claim") == 0
            owner_id = container_id(core_v1, namespace, "owner")
            # only the claim books the owner: no extended resource of the card is taken
            assert allocatable(core_v1, node) == CARD_MIB // 256

            loan = wait_for(lambda: lent(core_v1, node), timeout=60, what=f"card 0 lent\n{agent.log()}",
                            explain=lambda: who_holds(agent, card))
            assert (loan.owner, loan.owner_container) == (f"{namespace}/owner", "main"), loan
            assert (loan.memory_mib, loan.compute_percent) == (CARD_MIB, 100), loan  # the owner uses none of it
            print(f"\n  claim owner's loan: {loan.memory_mib} MiB, {loan.compute_percent} %")

            notes = {NAMES.assignment: assignment(node, BORROWER_MIB), LEND.borrowed: "true",
                     LEND.borrowed_from: f"{namespace}/owner"}
            core_v1.create_namespaced_pod(namespace, pod("borrower", node, image, WORKER.read_text(), notes, card,
                                                         BORROWER_MIB, None, None))
            wait_for(lambda: running(core_v1, namespace, "borrower"), timeout=90,
                     what=f"the borrower Running on the loan\n{agent.log()}")
            borrower_id = container_id(core_v1, namespace, "borrower")
            wait_for(lambda: holders(agent, card) >= {owner_id, borrower_id} or None, timeout=30,
                     what=f"owner and borrower holding the card\n{agent.log()}")
            time.sleep(1.5)  # the borrower's open recorded and allowed: the card stays lent
            assert lent(core_v1, node) is not None, agent.log()
            assert running(core_v1, namespace, "borrower") is not None, agent.log()

            began = time.monotonic()
            (trigger / "go-1").touch()  # the claim owner opens its card again: rule 1
            wait_for(lambda: borrower_id not in holders(agent, card) or None, timeout=30, interval=0.05,
                     what=f"the borrower's processes stopped\n{agent.log()}")
            wait_for(lambda: lent(core_v1, node) is None, timeout=30, interval=0.05,
                     what=f"the loan withdrawn\n{agent.log()}")
            back_s = time.monotonic() - began
            wait_for(lambda: pod_gone(core_v1, namespace, "borrower"), timeout=EVICTED_S, interval=0.05,
                     what=f"the borrower evicted and gone\n{agent.log()}")
            gone_s = time.monotonic() - began
            print(f"  claim owner's open to card back: {back_s:.2f} s; to the borrower's pod gone: {gone_s:.2f} s")
            assert back_s <= TARGET_S, agent.log()
            reasons = [e.reason for e in core_v1.list_namespaced_event(namespace).items
                       if e.involved_object.name == "borrower"]
            assert RECLAIMED_REASON in reasons, reasons
            assert [p.name for p in (tmp_path / "ckpt").rglob("ckpt-*")], "the borrower wrote no checkpoint"
            assert running(core_v1, namespace, "owner") is not None and owner_id in holders(agent, card)
            assert agent.running(), agent.log()
        finally:
            cleared(core_v1, resource, namespace, agent, card, "borrower", "owner")


def test_a_prepared_claim_whose_pod_does_not_hold_the_card_is_never_lent(
        containerd_kubelet: Kubelet, kube_api_client: client.ApiClient, core_v1: client.CoreV1Api,
        namespace: str, start_node_agent: Any, tmp_path: Path, claim_controller: None) -> None:
    kubelet = containerd_kubelet
    node, image = kubelet.node_name, kubelet.images.busybox.ref
    card, trigger = f"{tmp_path / 'dev'}/nvidia0", tmp_path / "trigger"
    trigger.mkdir()
    agent = start_agent(start_node_agent, kubelet, tmp_path)
    with dra_installed(kube_api_client, node) as resource:
        try:
            wait_for(lambda: node_slice(kube_api_client, node), timeout=60,
                     what=f"the agent's ResourceSlice\n{agent.log()}")
            # prepared (its pod runs) but never held: the container does not open the card
            resource.create_namespaced_resource_claim(namespace, claim("idle-claim", "4Gi", compute=30))
            core_v1.create_namespaced_pod(namespace, claim_pod("bystander", "idle-claim", node, image))
            wait_for(lambda: running(core_v1, namespace, "bystander"), timeout=120,
                     what=f"the bystander Running\n{agent.log()}")
            resource.create_namespaced_resource_claim(namespace, claim("owner-claim", "8Gi"))
            core_v1.create_namespaced_pod(namespace, claim_owner("owner", "owner-claim", node, image, card, trigger))
            wait_for(lambda: running(core_v1, namespace, "owner"), timeout=120,
                     what=f"the claim owner Running\n{agent.log()}",
                     explain=lambda: why_pending(core_v1, kube_api_client, namespace, "owner", "owner-claim"))
            assert {allocated_card(kube_api_client, resource, namespace, c) for c in ("idle-claim", "owner-claim")} \
                == {0}
            owner_id = container_id(core_v1, namespace, "owner")
            assert holders(agent, card) <= {owner_id}, who_holds(agent, card)

            loan = wait_for(lambda: lent(core_v1, node), timeout=60, what=f"card 0 lent\n{agent.log()}",
                            explain=lambda: who_holds(agent, card))
            assert loan.owner == f"{namespace}/owner", loan
            # 16 GiB and 100 % without the bystander's claim (the first case's loan)
            assert (loan.memory_mib, loan.compute_percent) == (CARD_MIB - 4096, 70), loan
            print(f"\n  loan beside a 4 GiB, 30 % claim not held: {loan.memory_mib} MiB, {loan.compute_percent} %")
            time.sleep(2.5)  # the next offers (at most one per 2 s) never give the claim's share back
            again = lent(core_v1, node)
            assert again is not None and (again.memory_mib, again.compute_percent) == (CARD_MIB - 4096, 70), again
            assert agent.running(), agent.log()
        finally:
            cleared(core_v1, resource, namespace, agent, card, "owner", "bystander")
