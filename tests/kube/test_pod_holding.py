"""What a pod object holds: the rule shared by the extender's bookings and the kubectl snapshot."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpupool.api.annotations import Allocated, encode_allocated
from gpupool.api.names import ResourceNames
from gpupool.core.model import Placement
from gpupool.kube.pod_holding import Holding, HoldingKind, PodRecord, holding, pod_record
from gpupool.kube.translate import node_spec
from tests.kube.builders import container, node, placed_pod, pod

NAMES = ResourceNames()
NOW = 1_000_000.0
TIMEOUT_S = 60.0
SPECS = {"n1": node_spec(node("n1", [16276, 16276]), NAMES)}
ASSIGNMENT = "gpupool.io/assignment-v1"
MISSING_CARD = ('{"v":1,"node":"n1","time":"2024-05-01T10:00:00Z","containers":[{"name":"main","init":false,'
                '"cards":[{"index":7,"uuid":"GPU-n1-7","memoryMiB":4000,"computeMilli":0,"exclusive":false}]}]}')
HOST_N1 = Placement("default/p", "n1", 1000, 0)


def assigned(*, bound: bool = True, when: float = NOW, node_name: str = "n1", card: int = 0,
             confirmed: bool = False, phase: str = "Pending") -> dict[str, Any]:
    raw = placed_pod("p", node_name, card, 4000, bound=bound, when=when)
    raw["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1"}
    raw["status"]["phase"] = phase
    if confirmed:
        stamp = dt.datetime.fromtimestamp(when, dt.UTC)
        raw["metadata"]["annotations"]["gpupool.io/allocated-v1"] = encode_allocated(Allocated(node_name, stamp))
    return raw


def annotated(text: str, *, node_name: str = "") -> dict[str, Any]:
    return pod("p", container(mib=4000, cpu="1"), node_name=node_name, annotations={ASSIGNMENT: text})


def record(raw: dict[str, Any]) -> PodRecord:
    found = pod_record(raw, NAMES)
    assert found is not None
    return found


@pytest.mark.parametrize(("raw", "kind", "host_only", "bound", "confirmed", "problem"), [
    pytest.param(assigned(phase="Succeeded"), HoldingKind.NOTHING, False, False, False, False, id="finished"),
    pytest.param(pod("p", container(mib=1000)), HoldingKind.NOTHING, False, False, False, False,
                 id="pending-without-assignment"),
    pytest.param(pod("p", container(cpu="1"), node_name="n1"), HoldingKind.HOST_ONLY, True, True, False, False,
                 id="bound-without-gpus"),
    pytest.param(pod("p", container(cpu="1"), node_name="n9"), HoldingKind.UNKNOWN_NODE, False, True, False,
                 False, id="bound-to-an-unknown-node"),
    pytest.param(annotated("{", node_name="n1"), HoldingKind.UNREADABLE, True, True, False, True,
                 id="bound-with-a-garbage-assignment"),
    pytest.param(annotated("{"), HoldingKind.NOTHING, False, False, False, True,
                 id="unbound-with-a-garbage-assignment"),
    pytest.param(annotated(MISSING_CARD, node_name="n1"), HoldingKind.UNREADABLE, True, True, False, True,
                 id="bound-assignment-naming-a-card-the-node-lacks"),
    pytest.param(annotated(MISSING_CARD), HoldingKind.NOTHING, False, False, False, True,
                 id="unbound-assignment-naming-a-card-the-node-lacks"),
    pytest.param(pod("p", container(cpu="1"), node_name="n1",
                     annotations=placed_pod("x", "n2", 0, 4000)["metadata"]["annotations"]),
                 HoldingKind.HOST_ONLY, True, True, False, False, id="bound-elsewhere-than-a-stale-assignment"),
    pytest.param(assigned(bound=False), HoldingKind.PLACEMENT, False, False, False, False, id="annotated"),
    pytest.param(assigned(bound=False, when=NOW - TIMEOUT_S - 1), HoldingKind.EXPIRED, False, False, False, False,
                 id="annotated-past-the-timeout"),
    pytest.param(assigned(bound=False, when=NOW - TIMEOUT_S - 1, confirmed=True), HoldingKind.PLACEMENT, False,
                 False, True, False, id="confirmed-holds-past-the-timeout"),
    pytest.param(assigned(when=NOW - TIMEOUT_S - 1), HoldingKind.PLACEMENT, False, True, False, False,
                 id="bound-never-times-out"),
    pytest.param(assigned(confirmed=True), HoldingKind.PLACEMENT, False, True, True, False, id="bound-and-confirmed"),
    pytest.param(assigned(bound=False, node_name="n9"), HoldingKind.UNKNOWN_NODE, False, False, False, False,
                 id="assigned-to-an-unknown-node"),
])
def test_what_a_pod_object_holds(raw: dict[str, Any], kind: HoldingKind, host_only: bool, bound: bool,
                                 confirmed: bool, problem: bool) -> None:
    held = holding(record(raw), SPECS.get, now=NOW, unconfirmed_timeout_s=TIMEOUT_S)
    assert (held.kind, held.bound, held.confirmed, held.problem is not None) == (kind, bound, confirmed, problem)
    if kind is HoldingKind.PLACEMENT:
        assert held.placement is not None and held.placement.containers  # its cards
        assert held.annotated == (not bound)
        assert (held.placement.node, held.placement.cpu_milli) == ("n1", 1000)
    elif host_only:
        assert held.placement == HOST_N1
    else:
        assert held.placement is None


def test_a_holding_without_a_placement_is_not_annotated() -> None:
    assert not Holding(HoldingKind.NOTHING).annotated


def test_a_record_keeps_each_reading_problem_apart() -> None:
    raw = annotated("{")
    raw["metadata"]["annotations"]["gpupool.io/allocated-v1"] = "{"
    raw["spec"]["containers"][0]["resources"]["limits"]["gpupool.io/gpu-mem"] = "lots"
    found = record(raw)
    assert found.assignment_unreadable and found.assignment_problem and found.allocated_problem
    assert found.request is None and found.request_problem
    assert found.problem == f"pod default/p: {found.assignment_problem}"  # the assignment's first


def test_a_pod_without_a_name_has_no_record_and_only_pods_with_gpus_or_assignments_keep_the_object() -> None:
    nameless = pod("p")
    del nameless["metadata"]["name"]
    assert pod_record(nameless, NAMES) is None
    assert record(pod("p", container(cpu="1"), node_name="n1")).raw is None
    assert record(pod("p")).raw is not None
