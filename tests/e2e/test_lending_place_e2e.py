"""The extender places a borrower on lent capacity through the real kube-scheduler v1.20.2.

The scheduler runs the shipped deploy/scheduler-config-v1beta1.yaml (only connection details
change, see test_scheduler_config_e2e.py) against the real ``gpupool extender`` process. The node
is a kubelet-less Node object with one card, held whole by its owner (a pod placed by hand), and a
``gpupool.io/lendable`` annotation written by the test as the node agent would when the owner
idles. A low-priority pod owned by a controller fits no free capacity: kube-scheduler binds it
through the extender onto the lent card, and the Binding carries the borrower marks the node
agent's Allocate vouches by. A high-priority pod asking the same is refused and stays pending.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.api.annotations import Inventory, decode_assignment, encode_inventory
from gpupool.api.lending import Lendable, LendableCard, LendingNames, encode_lendable, is_borrowed
from gpupool.api.names import NVIDIA_GPUMEM, ResourceNames
from gpupool.core.model import GpuCard
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.paths import Binaries
from tests.e2e import test_preempt_e2e
from tests.e2e.e2e_support import ExtenderProcess, MakeNode, wait_for
from tests.e2e.test_extender_e2e import placed_pod
from tests.e2e.test_preempt_e2e import probe, with_priority
from tests.e2e.test_scheduler_config_e2e import run_scheduler

pytestmark = pytest.mark.e2e
priority_classes = test_preempt_e2e.priority_classes  # the fixture: a low and a high PriorityClass

NAMES = ResourceNames()
LENDING = LendingNames()
CARD = 16276
LENT_MIB = 12000
ASKED_MIB = 8000
PENDING_S = 10.0
"""How long the high-priority pod is watched staying unbound after the borrower was bound."""


@pytest.fixture
def extender_process(control_plane: ControlPlane, tmp_path: Path) -> Iterator[ExtenderProcess]:
    process = ExtenderProcess(control_plane.kubeconfig, tmp_path / "extender.log")
    process.start()
    try:
        yield process
    finally:
        process.kill()


def test_a_low_priority_pod_borrows_the_idle_owners_card_and_a_high_priority_one_does_not(
    testenv_binaries: Binaries, control_plane: ControlPlane, core_v1: client.CoreV1Api, namespace: str,
    make_node: MakeNode, priority_classes: tuple[str, str], extender_process: ExtenderProcess, tmp_path: Path,
) -> None:
    low, high = priority_classes
    scheduler_name = f"gpupool-lend-{uuid.uuid4().hex[:6]}"
    node = f"lend-{uuid.uuid4().hex[:6]}"
    card = GpuCard(0, f"GPU-{node}-0", "Tesla-P100", CARD)
    owner = f"{namespace}/owner"
    loan = Lendable(time.time(), (LendableCard(0, card.uuid, owner, "main", LENT_MIB, 100, time.time()),))
    make_node(node, {"cpu": "64", "memory": "256Gi", "pods": "250", NVIDIA_GPUMEM: "1"},
              annotations={NAMES.inventory: encode_inventory(Inventory((card,))),
                           LENDING.lendable: encode_lendable(loan)})
    core_v1.create_namespaced_pod(namespace, placed_pod("owner", node, 0, CARD))
    wait_for(lambda: not extender_process.passes(probe(1000), [node]) or None, timeout=20,
             what="the extender books the owner's card")
    owner_map = core_v1.create_namespaced_config_map(namespace, {"metadata": {"name": "borrowers"}})
    scheduler = run_scheduler(testenv_binaries, control_plane, tmp_path, extender_process.url, scheduler_name)
    try:
        core_v1.create_namespaced_pod(namespace, waiting("borrower", node, scheduler_name, low, owner_map))
        bound = wait_for(lambda: core_v1.read_namespaced_pod("borrower", namespace).spec.node_name, timeout=90,
                         what="the low-priority pod bound onto the lent card")
        core_v1.create_namespaced_pod(namespace, waiting("urgent", node, scheduler_name, high, owner_map))
        time.sleep(PENDING_S)
        urgent = core_v1.read_namespaced_pod("urgent", namespace)
    finally:
        scheduler.stop()
    assert bound == node
    borrower = core_v1.read_namespaced_pod("borrower", namespace)
    annotations = borrower.metadata.annotations
    assert is_borrowed(annotations) and annotations[LENDING.borrowed_from] == owner
    assignment = decode_assignment(annotations[NAMES.assignment])
    assert [(c.index, c.memory_mib) for c in assignment.containers[0].cards] == [(0, ASKED_MIB)]
    assert assignment.pod_uid == borrower.metadata.uid
    assert urgent.spec.node_name is None  # no free capacity, and a high-priority pod never borrows
    assert not is_borrowed(urgent.metadata.annotations or {})


def waiting(name: str, node: str, scheduler: str, priority_class: str, owner: Any) -> dict[str, Any]:
    """A pod for ``scheduler`` asking ``ASKED_MIB`` on one card of ``node``, owned by a controller
    (a reclaimed borrower is replaced by it: such pods borrow without opting in)."""
    pod = with_priority(placed_pod(name, node, 0, ASKED_MIB), priority_class)
    pod["spec"].pop("nodeName")
    pod["spec"]["schedulerName"] = scheduler
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    pod["metadata"]["annotations"] = {}
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name,
                                           "uid": owner.metadata.uid, "controller": True}]
    return pod
