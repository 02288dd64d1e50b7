"""What a pod another system placed holds: the rule the extender's bookings and the kubectl snapshot
share (:func:`gpupool.kube.pod_holding.holding` with :mod:`gpupool.kube.adoption`)."""

from __future__ import annotations

from typing import Any

from gpupool.api.names import ResourceNames
from gpupool.kube.pod_holding import HoldingKind, holding, pod_record
from gpupool.kube.translate import node_spec
from tests.kube.builders import container, node, placed_pod, pod

NAMES = ResourceNames()
SPECS = {"n1": node_spec(node("n1", [16384, 16384]), NAMES)}
HAMI = {"hami.io/vgpu-devices-allocated": "GPU-n1-1,NVIDIA,12000,20:;", "hami.io/vgpu-node": "n1"}


def held(raw: dict[str, Any]) -> tuple[HoldingKind, list[tuple[int, int, int, bool]], str | None]:
    record = pod_record(raw, NAMES)
    assert record is not None
    found = holding(record, SPECS.get, now=0.0, unconfirmed_timeout_s=60.0)
    cards = [] if found.placement is None else \
        [(s.card, s.memory_mib, s.compute, s.exclusive) for c in found.placement.containers for s in c.slices]
    return found.kind, cards, found.problem


def test_a_bound_hami_pod_holds_its_slice_of_the_card_it_was_given() -> None:
    raw = pod("p", container(nvidia__gpu=1, mib=12000, cpu="2"), node_name="n1", annotations=HAMI)
    kind, cards, problem = held(raw)
    assert (kind, cards, problem) == (HoldingKind.PLACEMENT, [(1, 12000, 200, False)], None)


def test_an_unbound_pod_holds_nothing_whatever_its_annotations_say() -> None:
    assert held(pod("p", container(nvidia__gpu=1, mib=12000), annotations=HAMI))[0] is HoldingKind.NOTHING


def test_gpupools_own_assignment_wins_over_foreign_annotations() -> None:
    raw = placed_pod("p", "n1", 0, 4000)
    raw["metadata"]["annotations"].update(HAMI)
    kind, cards, _ = held(raw)
    assert kind is HoldingKind.PLACEMENT and cards == [(0, 4000, 0, False)]


def test_unreadable_foreign_annotations_refuse_the_node() -> None:
    raw = pod("p", container(nvidia__gpu=1), node_name="n1", annotations={"hami.io/vgpu-devices-allocated": ";"})
    kind, cards, problem = held(raw)
    assert kind is HoldingKind.UNREADABLE and cards == []
    assert problem is not None and "names no card" in problem


def test_a_share_that_cannot_be_read_holds_the_whole_card() -> None:
    raw = pod("p", container(**{"aliyun.com/gpu-mem": "4"}), node_name="n1",
              annotations={"ALIYUN_COM_GPU_MEM_IDX": "0"})
    kind, cards, problem = held(raw)
    assert (kind, cards) == (HoldingKind.PLACEMENT, [(0, 16384, 1000, True)])
    assert problem is not None and "whole card is booked" in problem
