"""Lending's whole loop on real parts: no placement, annotation or device written by hand.

The real kube-scheduler (v1.37.2) with the shipped configuration (only connection details changed,
see test_scheduler_config_e2e.py) calls the real ``gpupool extender`` (lending on, its default); a
real kubelet with containerd runs the pods; ``gpupool node-agent --lending`` serves one stand-in
card (a character device the host and the containers open alike) and runs the usage monitor;
kube-controller-manager runs the ReplicaSet controller.

1. The owner pod is placed by the scheduler and the extender (12 GiB of the 16 GiB card), opens
   its card and computes nothing: the monitor calls the card idle after ``--idle-after`` and the
   agent lends it (``lend-`` devices, ``gpupool.io/lendable``).
2. A ReplicaSet's low-priority pod asking 8 GiB fits no free capacity. The extender places it on
   the lent card and its Binding carries the borrower marks; the kubelet admits it only through
   the ``lend-`` devices (48 of the card's own 64 memory devices are the owner's), Allocate
   vouches, and it runs ``examples/checkpoint_worker.sh`` holding the card beside its idle owner.
   The extender would place a second borrower on the loan's room, and only there; a high-priority
   pod asking that room is never placed (it stays pending to the end).
3. The agent is restarted and resumes the loan. The owner opens the card again: the borrower's
   processes are stopped (it writes its checkpoint), it is evicted with a ``GpuReclaimed`` event,
   the node withdraws the loan and the extender's ledger follows.
4. The ReplicaSet replaces the borrower; the replacement waits until the owner idles again, is
   placed on the loan and resumes from the checkpoint (its controller's directory).

At every step, every holder of the card is a pod the extender's ledger books on it, and no card is
over-committed in the ledger.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from bench.reclaim import CARD_MIB, OWNER, TARGET_S, WORKER, one_card
from gpupool.api.annotations import decode_assignment
from gpupool.api.lending import RECLAIMED_REASON, LendingNames, decode_lendable, is_borrowed
from gpupool.api.names import ResourceNames
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.kubelet import Kubelet
from gpupool.testenv.paths import Binaries
from tests.e2e import real_containers, test_preempt_e2e
from tests.e2e.e2e_support import NO_SCHEDULER, ExtenderProcess, NodeAgentProcess, pod_gone, wait_for
from tests.e2e.test_preempt_e2e import with_priority
from tests.e2e.test_scheduler_config_e2e import run_scheduler
from tests.e2e.test_usage_monitor_real_containers_e2e import device_holders

# Also in the compatibility set run on the oldest supported Kubernetes minor (scripts/test-all).
pytestmark = [pytest.mark.e2e, pytest.mark.compat]

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)
priority_classes = test_preempt_e2e.priority_classes  # the fixture: a low and a high PriorityClass

NAMES, LEND = ResourceNames(), LendingNames()
OWNER_UNITS, BORROWER_UNITS = "48", "32"
"""gpu-mem in 256 MiB units: the owner 12 GiB, the borrower 8 GiB (more than the 4 GiB left free)."""
PROBE_UNITS = "20"
"""5 GiB: above the card's free 4 GiB, within what the loan keeps beside the borrower."""
CORE = "30"
EVICTED_S = 3.0
"""Bound on the reclaimed borrower's pod being gone after the loan is withdrawn (kubelet takes 4-8 s
to finalise a pod left Terminating)."""
PLACED_S = 60.0
"""Bound on a borrower's creation to Running on the lent card (the measured figure is printed)."""


def gpu_pod(name: str, node: str, image: str, scheduler: str, units: str, command: str,
            annotations: dict[str, str], prefix: str, trigger: Path | None = None) -> dict[str, Any]:
    """A busybox pod for ``scheduler`` asking ``units`` of gpu-mem on ``node``; ``$CARD`` is the
    device of the card its grant names."""
    mounts = [{"name": "trigger", "mountPath": "/trigger"}] if trigger else []
    container = {"name": "c", "image": image, "imagePullPolicy": "Never",
                 "command": ["sh", "-c", f'export CARD="$CARD_PREFIX$GPUPOOL_CARD_INDICES"; {command}'],
                 "resources": {"limits": {NAMES.gpu_mem: units, NAMES.gpu_core: CORE}},
                 "env": [{"name": "CARD_PREFIX", "value": prefix}], "volumeMounts": mounts}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
            "spec": {"schedulerName": scheduler, "nodeSelector": {"kubernetes.io/hostname": node},
                     "terminationGracePeriodSeconds": 1, "containers": [container],
                     "volumes": [{"name": "trigger", "hostPath": {"path": str(trigger)}}] if trigger else []}}


def test_an_idle_owners_card_is_lent_to_a_placed_borrower_and_returned_when_the_owner_opens_it(
    testenv_binaries: Binaries, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
    containerd_kubelet: Kubelet, tmp_path: Path, start_node_agent: Callable[..., NodeAgentProcess],
    extender_process: ExtenderProcess, priority_classes: tuple[str, str],
) -> None:
    low, high = priority_classes
    kubelet = containerd_kubelet
    node, image = kubelet.node_name, kubelet.images.busybox.ref
    cards = one_card(tmp_path / "dev")
    prefix, trigger = f"{tmp_path / 'dev'}/nvidia", tmp_path / "trigger"
    trigger.mkdir()
    agent = start_node_agent(kubelet, cards, ("--lending", "--idle-after", "2s", "--checkpoint-deadline", "3",
                                              "--checkpoint-dir", str(tmp_path / "ckpt"), "--lease-namespace", ""))
    scheduler_name = f"gpupool-loop-{uuid.uuid4().hex[:6]}"
    scheduler = run_scheduler(testenv_binaries, control_plane, tmp_path, extender_process.url, scheduler_name)
    try:
        control_plane.start_controllers(("replicaset",))
        wait_for(lambda: allocatable(core_v1, node) == CARD_MIB // 256, timeout=60,
                 what=f"the card's devices on {node}\n{agent.log()}")
        core_v1.create_namespaced_pod(namespace, gpu_pod("owner", node, image, scheduler_name, OWNER_UNITS, OWNER,
                                                         {}, prefix, trigger))
        owner = wait_for(lambda: running(core_v1, namespace, "owner"), timeout=90,
                         what=f"the owner placed and Running\n{agent.log()}")
        assert not is_borrowed(owner.metadata.annotations)
        [owned] = decode_assignment(owner.metadata.annotations[NAMES.assignment]).containers[0].cards
        assert (owned.index, owned.memory_mib) == (0, 12 * 1024)

        card = f"{prefix}0"
        loan = wait_for(lambda: lent(core_v1, node), timeout=60, what=f"card 0 lent\n{agent.log()}",
                        explain=lambda: who_holds(agent, card))
        assert loan.owner == f"{namespace}/owner" and loan.memory_mib > 8 * 1024, loan
        # kubelet admits a borrower only beside the card's own devices: the loan's appear too
        wait_for(lambda: allocatable(core_v1, node) > CARD_MIB // 256 or None, timeout=30,
                 what="the lent devices in the node's allocatable")

        apps = client.AppsV1Api(core_v1.api_client)
        template = with_priority(gpu_pod("borrower", node, image, scheduler_name, BORROWER_UNITS,
                                         WORKER.read_text(), {}, prefix), low)
        created = time.monotonic()
        apps.create_namespaced_replica_set(namespace, replica_set(template))
        first = wait_for(lambda: borrower_running(core_v1, namespace), timeout=PLACED_S,
                         what=f"the borrower placed and Running\n{agent.log()}")
        print(f"\n  borrower created to Running on the lent card: {time.monotonic() - created:.1f} s")
        check_borrower(first, namespace)
        name = first.metadata.name
        ids = {"owner": container_id(core_v1, namespace, "owner"), name: container_id_of(first)}
        wait_for(lambda: holders(agent, card) >= set(ids.values()) or None, timeout=30,
                 what=f"owner and borrower holding the card in the monitor's state\n{agent.log()}")
        time.sleep(1.5)  # the borrower's open recorded and allowed: the card stays lent
        assert lent(core_v1, node) is not None, agent.log()
        assert holders(agent, card) <= set(ids.values()), who_holds(agent, card)  # nobody the ledger does not book

        # a second borrower would still fit the loan (and only the loan) while it stands
        probe = gpu_pod("probe", node, image, NO_SCHEDULER, PROBE_UNITS, "true", {LEND.borrow: "true"}, prefix)
        core_v1.create_namespaced_pod(namespace, probe)
        wait_for(lambda: extender_process.passes(as_dict(core_v1, "probe", namespace), [node]) == [node] or None,
                 timeout=30, what="the extender passing a second borrower on the loan's room")
        core_v1.delete_namespaced_pod("probe", namespace, grace_period_seconds=0)  # it waits no longer
        # a high-priority pod that would fit there never borrows (it would lose the card to the owner)
        urgent = with_priority(gpu_pod("urgent", node, image, scheduler_name, PROBE_UNITS, WORKER.read_text(),
                                       {LEND.borrow: "true"}, prefix), high)
        core_v1.create_namespaced_pod(namespace, urgent)
        assert extender_process.metric("gpupool_cluster_lent_cards", state="lent") == 1

        # the agent restarted mid-lend resumes the loan (its owner still holds the card)
        agent.stop()
        agent.start()
        wait_for(lambda: "resuming the loan of card 0" in agent.log_path.read_text(), timeout=60,
                 what=f"the restarted agent resuming the loan\n{agent.log()}")
        wait_for(lambda: holders(agent, card) >= set(ids.values()) or None, timeout=30,
                 what=f"the restarted monitor finding both holders\n{agent.log()}")
        time.sleep(1.5)
        assert lent(core_v1, node) is not None and borrower_running(core_v1, namespace), agent.log()

        began = time.monotonic()
        (trigger / "go-1").touch()  # the owner opens its card again
        wait_for(lambda: ids[name] not in holders(agent, card), timeout=30, interval=0.05,
                 what=f"the borrower's processes stopped\n{agent.log()}")
        wait_for(lambda: lent(core_v1, node) is None, timeout=30, interval=0.05, what="the loan withdrawn")
        back_s = time.monotonic() - began
        print(f"  owner open to card back: {back_s:.2f} s")
        assert back_s <= TARGET_S
        # the extender's ledger follows before the idle owner lends the card again (2 s later)
        wait_for(lambda: extender_process.metric("gpupool_cluster_lent_cards", state="lent") == 0, timeout=2,
                 interval=0.05, what="the extender seeing the loan withdrawn")
        # evicted without a grace period (its processes are stopped): the pod, and its booking on the
        # loan in the extender's ledger, goes at once, not when kubelet finalises it seconds later
        wait_for(lambda: pod_gone(core_v1, namespace, name), timeout=EVICTED_S, interval=0.05,
                 what=f"the borrower evicted and gone\n{agent.log()}")
        reasons = [e.reason for e in core_v1.list_namespaced_event(namespace).items if e.involved_object.name == name]
        assert RECLAIMED_REASON in reasons, reasons
        assert [p.name for p in (tmp_path / "ckpt").rglob("ckpt-*")], "the borrower wrote no checkpoint"
        # Besides the owner only the replacement may hold the card: the idle owner lends it again 2 s
        # after its open (the loan ended 1-2 s after it) and the replacement is placed at once, while
        # the waits since may take 5 s. A holder the monitor has not named yet (kubelet reports a
        # container's ID after it starts; the monitor names it at its next scan, 1 s) is waited for.
        wait_for(lambda: holder_pods(agent, card) <= {"owner", *borrower_pods(core_v1, namespace, str(name))}
                 or None, timeout=10, what="the card held by the owner and the replacement only",
                 explain=lambda: who_holds(agent, card))

        # the ReplicaSet replaces the evicted borrower; it borrows again once the owner idles again
        wait_for(lambda: lent(core_v1, node) is not None, timeout=30, what="the card lent again",
                 explain=lambda: who_holds(agent, card))
        relent_at = time.monotonic()
        second = wait_for(lambda: borrower_running(core_v1, namespace, not_named=name), timeout=PLACED_S,
                          what=f"the replacement placed on the lent card again\n{agent.log()}")
        print(f"  card lent again to the waiting replacement Running: {time.monotonic() - relent_at:.1f} s")
        check_borrower(second, namespace)
        first_line = wait_for(lambda: log_lines(core_v1, second.metadata.name, namespace), timeout=10,
                              what="the replacement's log")[0]
        assert first_line.startswith("resumed from /var/run/gpupool/checkpoint/ckpt-"), first_line
        assert extender_process.metric("gpupool_extender_borrowers_placed_total") >= 2  # a retried bind counts again
        urgent_now = core_v1.read_namespaced_pod("urgent", namespace)  # pending all along (about 15 s)
        assert urgent_now.spec.node_name is None and not is_borrowed(urgent_now.metadata.annotations or {})
        refusals = [e.message for e in core_v1.list_namespaced_event(namespace).items
                    if e.involved_object.name == "urgent" and e.reason == "FailedScheduling"]
        assert any("a high-priority pod does not borrow" in m for m in refusals), refusals
        assert extender_process.metric("gpupool_extender_overcommitted_cards") == 0
        assert agent.running(), agent.log()
        apps.delete_namespaced_replica_set("borrowers", namespace)
    finally:
        scheduler.stop()
        control_plane.stop_controllers()


def replica_set(template: dict[str, Any]) -> dict[str, Any]:
    """One borrower replica: a controller's pod borrows without opting in, and its checkpoint
    directory is the controller's (the replacement resumes from it)."""
    labels = {"app": "borrowers"}
    meta = {**template["metadata"], "labels": labels}
    meta.pop("name")
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "borrowers"},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": meta, "spec": template["spec"]}}}


def borrower_pods(core_v1: client.CoreV1Api, namespace: str, not_named: str = "") -> set[str]:
    """Names of the ReplicaSet's pods other than ``not_named``."""
    metas = (p.metadata for p in core_v1.list_namespaced_pod(namespace, label_selector="app=borrowers").items)
    return {str(m.name) for m in metas if m is not None and m.name and m.name != not_named}


def borrower_running(core_v1: client.CoreV1Api, namespace: str, not_named: str = "") -> client.V1Pod | None:
    """The ReplicaSet's running pod (other than ``not_named``), or None."""
    for pod in core_v1.list_namespaced_pod(namespace, label_selector="app=borrowers").items:
        if pod.metadata.name != not_named and pod.metadata.deletion_timestamp is None:
            found = running(core_v1, namespace, pod.metadata.name)
            if found is not None:
                return found
    return None


def check_borrower(pod: client.V1Pod, namespace: str) -> None:
    """Placed by the extender on the lent card, with the marks the agent's Allocate vouched by."""
    notes = pod.metadata.annotations
    assert is_borrowed(notes) and notes[LEND.borrowed_from] == f"{namespace}/owner", notes
    assignment = decode_assignment(notes[NAMES.assignment])
    [borrowed] = assignment.containers[0].cards
    assert (borrowed.index, borrowed.memory_mib) == (0, 8 * 1024)
    assert assignment.pod_uid == pod.metadata.uid


def as_dict(core_v1: client.CoreV1Api, name: str, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = core_v1.api_client.sanitize_for_serialization(core_v1.read_namespaced_pod(name, namespace))
    return found


def log_lines(core_v1: client.CoreV1Api, name: str, namespace: str) -> list[str] | None:
    return str(core_v1.read_namespaced_pod_log(name, namespace)).splitlines() or None


def allocatable(core_v1: client.CoreV1Api, node: str) -> int:
    return int((core_v1.read_node(node).status.allocatable or {}).get(NAMES.gpu_mem, "0"))


def lent(core_v1: client.CoreV1Api, node: str) -> Any:
    """Card 0's entry in the node's ``lendable`` annotation, or None."""
    raw = (core_v1.read_node(node).metadata.annotations or {}).get(LEND.lendable)
    return next((c for c in decode_lendable(raw).cards if c.index == 0), None) if raw else None


def running(core_v1: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    pod = core_v1.read_namespaced_pod(name, namespace)
    assert pod.status.phase not in ("Failed", "Succeeded"), (pod.status.phase, pod.status.container_statuses)
    return pod if pod.status.phase == "Running" and container_id_of(pod) else None


def container_id_of(pod: client.V1Pod) -> str | None:
    statuses = pod.status.container_statuses or []
    return str(statuses[0].container_id).partition("://")[2] if statuses and statuses[0].container_id else None


def container_id(core_v1: client.CoreV1Api, namespace: str, name: str) -> str:
    found = container_id_of(core_v1.read_namespaced_pod(name, namespace))
    assert found, name
    return found


def holders(agent: NodeAgentProcess, card: str) -> set[str]:
    """Container IDs of the processes holding ``card`` in the monitor's state file."""
    return {h["containerId"] for h in device_holders(agent.usage_state).get(card, []) if h.get("containerId")}


def holder_pods(agent: NodeAgentProcess, card: str) -> set[str]:
    """The pods of the processes holding ``card``, as the monitor names them ("" for one it has not
    named: no pod of this node runs it, or kubelet has not reported its container yet)."""
    return {str(h.get("pod") or "") for h in device_holders(agent.usage_state).get(card, [])}


def who_holds(agent: NodeAgentProcess, card: str) -> str:
    """The card's holders for an assertion message. A holder of no pod of this node, on a machine
    that runs tests beside each other, is most likely another run's container: every run's stand-in
    card has /dev/random's device number and the monitor knows a card by its number (the runs must
    take turns on one real-kubelet lock, scripts/test-all)."""
    named = [f"pid {h.get('pid')} container {str(h.get('containerId') or '?')[:12]} "
             f"pod {h.get('namespace')}/{h.get('pod')}" if h.get("pod") else
             f"pid {h.get('pid')} container {str(h.get('containerId') or '?')[:12]}: no pod of this node"
             for h in device_holders(agent.usage_state).get(card, [])]
    return "holders: " + "; ".join(named)
