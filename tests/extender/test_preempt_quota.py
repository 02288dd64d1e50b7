"""Preempt evicts nobody for a placement the preemptor's bind would refuse: a node whose only
freeable cards are of a model its namespace's quota leaves no room on is left out (the admission's
model layer closes them), and every placement the what-if finds passes the bind's exact quota
check too (the model layer is an estimate)."""

from __future__ import annotations

from typing import Any

from gpupool.core.model import Placement
from gpupool.extender.preemption import what_if_scheduler
from gpupool.extender.service import ExtenderService
from gpupool.extender.victims import fits_on
from tests.extender.tenancy_world import CARD, gpu_pod, quota, read, world
from tests.kube.builders import node, placed_pod

LOW, HIGH = 1, 100


def low(name: str, namespace: str, node_name: str, card: int) -> dict[str, Any]:
    raw = placed_pod(name, node_name, card, CARD)
    raw["metadata"].update(namespace=namespace, uid=f"uid-{namespace}-{name}")
    raw["spec"]["priority"] = LOW
    return raw


def test_preempt_leaves_out_the_node_whose_cards_the_quota_refuses() -> None:
    cache = world([node("v100", [CARD, CARD]), node("a100", [CARD, CARD], model="Tesla-A100")],
                  quotas=[quota("team-a", hard={"memoryMiB": 4 * CARD}, models={"Tesla-A100": {"memoryMiB": 0}})])
    cache.replace_pods([low("x", "other", "v100", 0), low("y", "other", "v100", 1),
                        low("z", "other", "a100", 0), low("w", "other", "a100", 1)])
    urgent = gpu_pod("urgent", gpu_mem=CARD // 256)
    urgent["spec"]["priority"] = HIGH
    request, tenant = read(cache, urgent)
    answer, error = ExtenderService(cache, None).preempt(request, {"v100": [], "a100": []}, tenant)
    assert error == ""
    assert set(answer) == {"v100"} and len(answer["v100"]) == 1


def test_a_placement_the_quota_check_refuses_does_not_fit() -> None:
    cache = world([node("v100", [CARD, CARD])])
    cache.replace_pods([low("x", "other", "v100", 0)])
    request, _ = read(cache, gpu_pod("urgent", gpu_mem=CARD // 256))
    asked: list[Placement] = []

    def refuse(placement: Placement) -> str:
        asked.append(placement)
        return "GpuQuota team-a/gpus: no room"

    with cache.lock:
        assert fits_on(cache.state, "v100", request, what_if_scheduler(cache))(frozenset())
        assert not fits_on(cache.state, "v100", request, what_if_scheduler(cache), refuse)(frozenset())
    assert [p.node for p in asked] == ["v100"]
