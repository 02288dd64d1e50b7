"""Preempt chooses the GPU victims itself: kube-scheduler, blind to gpupool's ignored resources,
proposes nodes with no victims; the answer names the fewest lower-priority pods whose cards free
enough, borrowers first, and never a pod of the preemptor's priority or above."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.core.model import PodRequest
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import ExtenderService
from gpupool.extender.victims import Holder, choose_victims
from gpupool.kube.translate import pod_request
from tests.kube.builders import container, node, placed_pod, pod

CARD = 16276
HIGH = 1000


def held(name: str, card: int, mib: int, *, priority: int = 0, borrowed: bool = False) -> dict[str, Any]:
    raw = placed_pod(name, "N1", card, mib)
    raw["spec"]["priority"] = priority
    if borrowed:
        raw["metadata"]["annotations"]["gpupool.io/borrowed"] = "true"
    return raw


def service_with(*pods: dict[str, Any]) -> tuple[ExtenderService, ClusterCache]:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes([node("N1", [CARD, CARD])])
    cache.replace_pods(list(pods))
    return ExtenderService(cache, None), cache


def preemptor(mib: int, priority: int = HIGH) -> PodRequest:
    raw = pod("p", container(mib=mib, cpu="1"))
    raw["spec"]["priority"] = priority
    return pod_request(raw, ClusterCache().names)


def uid(name: str) -> str:
    return f"uid-default-{name}"


@pytest.mark.parametrize(("pods", "mib", "victims"), [
    pytest.param([held("a", 0, 8000), held("b", 0, 8000), held("c", 1, 12000)], 12000, {"c"},
                 id="one-pod-on-the-other-card-rather-than-two"),
    pytest.param([held("a", 0, 8000), held("c", 1, 8000, borrowed=True)], 12000, {"c"},
                 id="a-borrower-before-a-regular-pod"),
    pytest.param([held("a", 0, 8000, priority=5), held("c", 1, 8000, priority=1)], 12000, {"c"},
                 id="the-lower-priority-first"),
    pytest.param([held("a", 0, 8000), held("b", 0, 8000), held("c", 1, 8000)], 16276, {"c"},
                 id="a-whole-card-frees-by-its-single-holder"),
    pytest.param([held("a", 0, 16276), held("c", 1, 16276)], 20000, None,
                 id="nothing-frees-more-than-a-card"),
    pytest.param([held("a", 0, 16276, priority=HIGH), held("c", 1, 16276, priority=HIGH + 1)], 1000, None,
                 id="never-a-pod-of-the-same-or-higher-priority"),
    # fits already: kube-scheduler < kubernetes#101560 crashes on a candidate with no victims
    pytest.param([held("a", 0, 8000), held("c", 1, 1000)], 1000, None, id="fits-already-node-left-out"),
])
def test_preempt_names_the_fewest_victims_that_free_the_right_card(
        pods: list[dict[str, Any]], mib: int, victims: set[str] | None) -> None:
    service, _ = service_with(*pods)
    answer, error = service.preempt(preemptor(mib), {"N1": []})
    assert error == ""
    if victims is None:
        assert answer == {}
    else:
        assert sorted(answer["N1"]) == sorted(uid(v) for v in victims)


def test_the_proposed_victims_stay_and_gpu_victims_are_added() -> None:
    service, _ = service_with(held("a", 0, 2000), held("b", 0, 12000), held("c", 1, 16276))
    answer, _ = service.preempt(preemptor(12000), {"N1": [uid("a")]})
    assert answer == {"N1": [uid("a"), uid("b")]}  # a alone leaves 4,276 MiB on card 0


def test_preempt_reprieves_a_victim_the_pod_does_not_need() -> None:
    """Three low holders on card 0 and card 1; the card-ordered pass finds card 1's one holder."""
    calls: list[frozenset[str]] = []
    holders = [Holder("a", "ua", 0, cards=(0,)), Holder("b", "ub", 0, cards=(1,))]

    def fits(without: frozenset[str]) -> bool:
        calls.append(without)
        return "b" in without

    assert choose_victims(preemptor(1000), (), holders, fits) == frozenset({"b"})
    assert calls  # the question was asked of the what-if, not answered from the holders alone


def test_the_shipped_scheduler_configurations_call_preempt() -> None:
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    configs = sorted(deploy.glob("scheduler-config-*.yaml"))
    assert [p.name for p in configs] == ["scheduler-config-v1-prioritize.yaml", "scheduler-config-v1.yaml"]
    for path in configs:
        assert yaml.safe_load(path.read_text())["apiVersion"] == "kubescheduler.config.k8s.io/v1", path.name
        (entry,) = yaml.safe_load(path.read_text())["extenders"]
        assert entry["preemptVerb"] == "preempt", path.name
