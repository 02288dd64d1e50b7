"""``why``: the core's reasons per node, grouped, and the verdict when the pod fits somewhere."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.names import NVIDIA_GPUMEM
from gpupool.core.model import PodRequest
from gpupool.kube.refusal_texts import alias_problem
from gpupool.kube.translate import foreign_resources, pod_request
from gpupool.kubectl.snapshot import build_snapshot
from gpupool.kubectl.why import Explanation, explain, group_reasons, head, why_json, why_text
from tests.kubectl.objects import NAMES, NOW, gpu_node, gpu_pod, placed

CARD = 16384


def request_of(pod: dict[str, Any]) -> PodRequest:
    return pod_request(pod, NAMES)


def answer(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], wanted: dict[str, Any]) -> Explanation:
    snapshot = build_snapshot(nodes, pods, NAMES, now=NOW.timestamp())
    return explain(snapshot, request_of(wanted), foreign_resources(wanted))


@pytest.mark.parametrize("reason, expected", [
    pytest.param("no single card has 8192 MiB free; largest free 4096 MiB", "no single card has 8192 MiB free",
                 id="card-memory"),
    pytest.param("insufficient CPU: 4000m requested, 1000m free", "insufficient CPU", id="cpu"),
    pytest.param("node does not serve x", "node does not serve x", id="no-separator"),
])
def test_head_is_the_part_nodes_share(reason: str, expected: str) -> None:
    assert head(reason) == expected


def test_groups_are_largest_first_with_each_nodes_own_sentence() -> None:
    groups = group_reasons({"n3": "insufficient CPU: 2m free", "n1": "no single card has 9 MiB free; largest 1",
                            "n2": "no single card has 9 MiB free; largest 2"})
    assert [(g.head, len(g.nodes)) for g in groups] == [("no single card has 9 MiB free", 2), ("insufficient CPU", 1)]
    assert groups[0].nodes[0] == ("n1", "no single card has 9 MiB free; largest 1")


def test_a_pod_that_fits_nowhere_gets_the_core_reasons_grouped() -> None:
    nodes = [gpu_node("full-1", [CARD]), gpu_node("full-2", [CARD]), gpu_node("small-cpu", [CARD], cpu="1")]
    pods = [placed("big-1", "full-1", 0, 60), placed("big-2", "full-2", 0, 60)]
    result = answer(nodes, pods, gpu_pod("want", 32, cpu="2"))
    assert result.fits == ()
    assert [(g.head, len(g.nodes)) for g in result.groups] == [
        ("no single card has 8192 MiB free", 2), ("insufficient CPU", 1)]
    assert result.groups[0].nodes[0] == ("full-1", "no single card has 8192 MiB free; largest free 1024 MiB")
    text = why_text(result, examples=1)
    assert text.splitlines() == [
        "pod team/want fits on none of 3 nodes:",
        "  2 nodes: no single card has 8192 MiB free",
        "      full-1: no single card has 8192 MiB free; largest free 1024 MiB",
        "      ... and 1 more",
        "  1 node: insufficient CPU",
        "      small-cpu: insufficient CPU: 2000m requested, 1000m free",
    ]


def test_a_request_larger_than_any_card_is_said_once() -> None:
    result = answer([gpu_node("a", [CARD]), gpu_node("b", [CARD])], [], gpu_pod("huge", 100))
    assert result.everywhere == "container main asks for 25600 MiB on one card; the largest card has 16384 MiB"
    assert why_text(result, examples=3) == f"pod team/huge fits on no node: {result.everywhere}"
    assert why_json(result)["groups"][0]["count"] == 2


def test_a_pod_that_fits_names_the_best_nodes() -> None:
    nodes = [gpu_node("empty", [CARD]), gpu_node("busy", [CARD]), gpu_node("full", [CARD])]
    pods = [placed("a", "busy", 0, 20), placed("b", "full", 0, 64)]
    result = answer(nodes, pods, gpu_pod("want", 8))
    assert {name for name, _ in result.fits} == {"empty", "busy"}
    assert [g.head for g in result.groups] == ["no single card has 2048 MiB free"]
    text = why_text(result, examples=3)
    assert text.startswith("pod team/want fits on 2 nodes of 3 by gpupool's booking")
    assert "other nodes:" in text


def test_refused_nodes_and_unserved_aliases_get_the_extenders_reasons() -> None:
    broken = gpu_node("broken", [CARD], listed=(NVIDIA_GPUMEM,))
    broken["metadata"]["annotations"][NAMES.inventory] = "garbage"
    nodes = [broken, gpu_node("serves", [CARD], listed=(NVIDIA_GPUMEM,)), gpu_node("plain", [CARD])]
    wanted = gpu_pod("alias", None, limits={NVIDIA_GPUMEM: "1000"})
    result = answer(nodes, [], wanted)
    reasons = {node: reason for g in result.groups for node, reason in g.nodes}
    assert reasons["plain"] == alias_problem(frozenset({NVIDIA_GPUMEM}), frozenset())  # the extender's sentence
    assert "inventory-v1" in reasons["broken"]
    assert [name for name, _ in result.fits] == ["serves"]


def test_the_pods_own_assignment_does_not_stand_in_its_way() -> None:
    mine = placed("want", "only", 0, 40) | {"spec": gpu_pod("want", 40)["spec"]}
    snapshot = build_snapshot([gpu_node("only", [CARD])], [mine], NAMES, now=NOW.timestamp(),
                              leave_out=frozenset({"team/want"}))
    assert [name for name, _ in explain(snapshot, request_of(gpu_pod("want", 40))).fits] == ["only"]


def test_json_lists_every_node_and_kube_schedulers_word() -> None:
    nodes = [gpu_node(f"n{i}", [CARD]) for i in range(5)]
    pods = [placed(f"p{i}", f"n{i}", 0, 64) for i in range(5)]
    doc = why_json(answer(nodes, pods, gpu_pod("want", 8)), "0/5 nodes are available")
    assert doc["groups"][0]["count"] == 5 and len(doc["groups"][0]["nodes"]) == 5
    assert doc["schedulerSays"] == "0/5 nodes are available"
