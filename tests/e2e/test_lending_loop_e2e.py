"""Lending's whole loop on real parts: no placement, annotation or device written by hand.

The real kube-scheduler v1.20.2 with the shipped configuration (only connection details changed,
see test_scheduler_config_e2e.py) calls the real ``gpupool extender`` (lending on, its default); a
real kubelet with containerd runs the pods; ``gpupool node-agent --lending`` serves one stand-in
card (a character device the host and the containers open alike) and runs the usage monitor.

1. The owner pod is placed by the scheduler and the extender (12 GiB of the 16 GiB card), opens
   its card and computes nothing: the monitor calls the card idle after ``--idle-after`` and the
   agent lends it (``lend-`` devices, ``gpupool.io/lendable``).
2. A low-priority pod asking 8 GiB fits no free capacity. The extender places it on the lent card
   and its Binding carries the borrower marks; the kubelet admits it only through the ``lend-``
   devices (the card's own 64 memory devices are 48 taken), Allocate vouches, and it runs
   ``examples/checkpoint_worker.sh`` holding the card beside its idle owner.
3. The owner opens the card again: the borrower's processes are stopped (it writes its
   checkpoint), it is evicted with a ``GpuReclaimed`` event, the node withdraws the loan and the
   extender's ledger takes no new borrower there.

Throughout, every holder of the card is a pod the extender's ledger books on it, and no card is
over-committed in the ledger.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from bench.reclaim import OWNER, WORKER
from gpupool.api.annotations import decode_assignment
from gpupool.api.lending import RECLAIMED_REASON, LendingNames, decode_lendable, is_borrowed
from gpupool.api.names import ResourceNames
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.kubelet import Kubelet
from gpupool.testenv.paths import Binaries
from tests.e2e import real_containers
from tests.e2e.e2e_support import NO_SCHEDULER, ExtenderProcess, NodeAgentProcess, wait_for
from tests.e2e.test_scheduler_config_e2e import run_scheduler
from tests.e2e.test_usage_monitor_real_containers_e2e import device_holders

pytestmark = pytest.mark.e2e

containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

NAMES, LEND = ResourceNames(), LendingNames()
CARD_MIB = 16384
OWNER_UNITS, BORROWER_UNITS = "48", "32"
"""gpu-mem in 256 MiB units: the owner 12 GiB, the borrower 8 GiB (more than the 4 GiB left free)."""
PROBE_UNITS = "20"
"""5 GiB: above the card's free 4 GiB, within what the loan keeps beside the borrower."""
CORE = "30"
PLACED_S = 60.0
"""Bound on a borrower's creation to Running on the lent card (the measured figure is printed)."""


def one_stand_in_card(directory: Path) -> str:
    """One card device (``/dev/random``'s numbers) and the ``--fake-gpus`` file naming it."""
    directory.mkdir(parents=True)
    os.mknod(directory / "nvidia0", 0o666 | 0o020000, os.makedev(*real_containers.CARD_DEVICES[0]))
    return (f"model: Tesla-T4\ndevicePathPrefix: {directory}/nvidia\n"
            f"cards:\n  - {{uuid: GPU-real-0000, memoryMiB: {CARD_MIB}}}\n")


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


@pytest.fixture
def extender(control_plane: ControlPlane, tmp_path: Path) -> Iterator[ExtenderProcess]:
    process = ExtenderProcess(control_plane.kubeconfig, tmp_path / "extender.log")
    process.start()
    try:
        yield process
    finally:
        process.kill()


def test_an_idle_owners_card_is_lent_to_a_placed_borrower_and_returned_when_the_owner_opens_it(
    testenv_binaries: Binaries, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
    containerd_kubelet: Kubelet, tmp_path: Path, start_node_agent: Callable[..., NodeAgentProcess],
    extender: ExtenderProcess,
) -> None:
    kubelet = containerd_kubelet
    node, image = kubelet.node_name, kubelet.images.busybox.ref
    cards = one_stand_in_card(tmp_path / "dev")
    prefix, trigger = f"{tmp_path / 'dev'}/nvidia", tmp_path / "trigger"
    trigger.mkdir()
    agent = start_node_agent(kubelet, cards, ("--lending", "--idle-after", "2s", "--checkpoint-deadline", "3",
                                              "--checkpoint-dir", str(tmp_path / "ckpt"), "--lease-namespace", ""))
    scheduler_name = f"gpupool-loop-{uuid.uuid4().hex[:6]}"
    scheduler = run_scheduler(testenv_binaries, control_plane, tmp_path, extender.url, scheduler_name)
    try:
        wait_for(lambda: allocatable(core_v1, node) == CARD_MIB // 256, timeout=60,
                 what=f"the card's devices on {node}\n{agent.log()}")
        core_v1.create_namespaced_pod(namespace, gpu_pod("owner", node, image, scheduler_name, OWNER_UNITS, OWNER,
                                                         {}, prefix, trigger))
        owner = wait_for(lambda: running(core_v1, namespace, "owner"), timeout=90,
                         what=f"the owner placed and Running\n{agent.log()}")
        assert not is_borrowed(owner.metadata.annotations)
        [owned] = decode_assignment(owner.metadata.annotations[NAMES.assignment]).containers[0].cards
        assert (owned.index, owned.memory_mib) == (0, 12 * 1024)

        loan = wait_for(lambda: lent(core_v1, node), timeout=60, what=f"card 0 lent\n{agent.log()}")
        assert loan.owner == f"{namespace}/owner" and loan.memory_mib > 8 * 1024, loan
        # kubelet admits a borrower only beside the card's own devices: the loan's appear too
        wait_for(lambda: allocatable(core_v1, node) > CARD_MIB // 256 or None, timeout=30,
                 what="the lent devices in the node's allocatable")

        created = time.monotonic()
        core_v1.create_namespaced_pod(namespace, gpu_pod("borrower", node, image, scheduler_name, BORROWER_UNITS,
                                                         WORKER.read_text(), {LEND.borrow: "true"}, prefix))
        borrower = wait_for(lambda: running(core_v1, namespace, "borrower"), timeout=PLACED_S,
                            what=f"the borrower placed and Running\n{agent.log()}")
        placed_s = time.monotonic() - created
        print(f"\n  borrower created to Running on the lent card: {placed_s:.1f} s")
        notes = borrower.metadata.annotations
        assert is_borrowed(notes) and notes[LEND.borrowed_from] == f"{namespace}/owner", notes
        [borrowed] = decode_assignment(notes[NAMES.assignment]).containers[0].cards
        assert (borrowed.index, borrowed.memory_mib) == (0, 8 * 1024)
        ids = {name: container_id(core_v1, namespace, name) for name in ("owner", "borrower")}
        card = f"{prefix}0"
        wait_for(lambda: holders(agent, card) >= {ids["owner"], ids["borrower"]} or None, timeout=30,
                 what=f"owner and borrower holding the card in the monitor's state\n{agent.log()}")
        time.sleep(1.5)  # the borrower's open recorded and allowed: the card stays lent
        assert lent(core_v1, node) is not None, agent.log()
        assert holders(agent, card) <= set(ids.values())  # nobody the ledger does not book
        assert extender.metric("gpupool_extender_overcommitted_cards") == 0

        # a second borrower would still fit the loan (and only the loan) while it stands
        probe = gpu_pod("probe", node, image, NO_SCHEDULER, PROBE_UNITS, "true", {LEND.borrow: "true"}, prefix)
        core_v1.create_namespaced_pod(namespace, probe)
        probe = core_v1.api_client.sanitize_for_serialization(wait_for(
            lambda: core_v1.read_namespaced_pod("probe", namespace), timeout=5, what="probe"))
        wait_for(lambda: extender.passes(probe, [node]) == [node] or None, timeout=30,
                 what="the extender passing a second borrower on the loan's room")

        began = time.monotonic()
        (trigger / "go-1").touch()  # the owner opens its card again
        wait_for(lambda: ids["borrower"] not in holders(agent, card), timeout=30, interval=0.05,
                 what=f"the borrower's processes stopped\n{agent.log()}")
        wait_for(lambda: lent(core_v1, node) is None, timeout=30, interval=0.05, what="the loan withdrawn")
        print(f"  owner open to card back: {time.monotonic() - began:.2f} s")
        wait_for(lambda: gone(core_v1, namespace, "borrower"), timeout=60, what=f"the borrower evicted\n{agent.log()}")
        reasons = [e.reason for e in core_v1.list_namespaced_event(namespace).items
                   if e.involved_object.name == "borrower"]
        assert RECLAIMED_REASON in reasons, reasons
        assert [p.name for p in (tmp_path / "ckpt").rglob("ckpt-*")], "the borrower wrote no checkpoint"
        assert holders(agent, card) <= {ids["owner"]}
        # the extender's ledger follows: the card is no longer lent, so no new borrower is placed there
        wait_for(lambda: not extender.passes(probe, [node]) or None, timeout=30,
                 what="the extender refusing a borrower once the loan is withdrawn")
        assert extender.metric("gpupool_extender_overcommitted_cards") == 0
        assert agent.running(), agent.log()
    finally:
        scheduler.stop()


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


def gone(core_v1: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        pod = core_v1.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        return exc.status == 404
    return pod.metadata.deletion_timestamp is not None or pod.status.phase in ("Failed", "Succeeded")
