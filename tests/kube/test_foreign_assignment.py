"""A pod that carries an assignment decided for another pod (its ``podUID``): what it holds.

On v1.20-v1.22 a Binding lands on whichever pod has its name, so a pod replaced between the
extender's decision and its Binding ends bound with its predecessor's assignment. Its cards are not
the replacement's: the node agent refuses to grant them, so the pod holds what an assignment that
cannot be used holds, and an agent from before ``podUID`` might still grant them, so a bound pod
that asks for GPUs keeps GPU pods off its node until it ends (``UNREADABLE``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpupool.api.annotations import Assignment, CardRef, ContainerCards, encode_assignment
from gpupool.api.names import ResourceNames
from gpupool.core.model import Placement
from gpupool.kube.pod_holding import HoldingKind, holding, pod_record
from gpupool.kube.translate import node_spec
from tests.kube.builders import container, node, pod

NAMES = ResourceNames()
NOW = 1_000_000.0
TIMEOUT_S = 60.0
SPECS = {"n1": node_spec(node("n1", [16276]), NAMES)}
ASSIGNMENT = "gpupool.io/assignment-v1"
OWN_UID = "uid-of-this-pod"


def carrying(decided_for: str, *, bound: bool = True, wants_gpu: bool = True,
             phase: str = "Pending") -> dict[str, Any]:
    """Pod ``p`` (uid :data:`OWN_UID`) carrying an assignment of 4000 MiB on card 0 of n1 decided
    for ``decided_for`` ("" for a document written before ``podUID``)."""
    stamp = dt.datetime.fromtimestamp(NOW, dt.UTC)
    text = encode_assignment(Assignment("n1", stamp, (ContainerCards("main", (CardRef(0, "GPU-n1-0", 4000, 0),)),),
                                        pod_uid=decided_for))
    asks = container(mib=4000, cpu="1") if wants_gpu else container(cpu="1")
    return pod("p", asks, uid=OWN_UID, node_name="n1" if bound else "", annotations={ASSIGNMENT: text},
               phase=phase)


@pytest.mark.parametrize(("raw", "kind", "problem"), [
    pytest.param(carrying(OWN_UID), HoldingKind.PLACEMENT, False, id="its-own"),
    pytest.param(carrying(""), HoldingKind.PLACEMENT, False, id="written-before-podUID"),
    pytest.param(carrying("uid-of-the-predecessor"), HoldingKind.UNREADABLE, True,
                 id="bound-with-the-predecessors"),
    pytest.param(carrying("uid-of-the-predecessor", wants_gpu=False), HoldingKind.HOST_ONLY, True,
                 id="bound-with-the-predecessors-asking-no-gpu"),
    pytest.param(carrying("uid-of-the-predecessor", bound=False), HoldingKind.NOTHING, True,
                 id="annotated-with-the-predecessors"),
    pytest.param(carrying("uid-of-the-predecessor", phase="Failed"), HoldingKind.NOTHING, True,
                 id="failed-at-admission"),
])
def test_what_a_pod_carrying_another_pods_assignment_holds(raw: dict[str, Any], kind: HoldingKind,
                                                           problem: bool) -> None:
    record = pod_record(raw, NAMES)
    assert record is not None
    held = holding(record, SPECS.get, now=NOW, unconfirmed_timeout_s=TIMEOUT_S)
    assert held.kind is kind
    if kind is HoldingKind.PLACEMENT:
        assert held.placement is not None and held.placement.containers
        return
    if held.placement is not None:  # its CPU and memory on its node, none of the cards
        assert held.placement == Placement("default/p", "n1", 1000, 0)
    assert (held.problem is not None) == problem
    if problem:
        assert held.problem is not None
        assert "decided for pod uid uid-of-the-predecessor, not this pod (uid uid-of-this-pod)" in held.problem


def test_the_record_keeps_the_foreign_assignment_decoded_so_a_pin_recognises_its_own_write() -> None:
    record = pod_record(carrying("uid-of-the-predecessor"), NAMES)
    assert record is not None and record.assignment is not None
    assert record.assignment.pod_uid == "uid-of-the-predecessor"
    assert record.assignment_unreadable
    assert record.problem is not None and record.problem.startswith("pod default/p: assignment-v1 was decided")
