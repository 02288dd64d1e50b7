"""Feasibility: card and node masks, up-front request problems and per-node reasons in words."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.card_rule import CardVerdict
from gpupool.core.feasibility import (
    card_fit_mask,
    card_verdicts,
    explain_node,
    memory_need,
    node_fit_mask,
    request_problem,
)
from gpupool.core.model import ContainerRequest, GpuKind, GpuRequest, PodRequest
from gpupool.core.state import ClusterState
from tests.core.builders import book_slice, book_whole, make_node, mem_pod, pod_with, rows, slice_pod

ALI = 16_276  # the card of Alibaba's gpushare examples


@pytest.fixture
def state() -> ClusterState:
    """n0: 2 x A (16 GiB), half of card 0 used; n1: 2 x B (32 GiB), card 0 exclusive; n2: 1 x A virtual."""
    state = ClusterState([
        make_node("n0", 2, model="A", cpu=4_000, memory=8_000),
        make_node("n1", [32_768, 32_768], model="B"),
        make_node("n2", [8_192], model="A", kind=GpuKind.VIRTUAL),
    ])
    book_slice(state, "used", "n0", 0, compute=500, memory=8_192)
    book_whole(state, "whole", "n1", 0)
    return state


ALL = rows(0, 1, 2)


def test_memory_need_per_card(state: ClusterState) -> None:
    np.testing.assert_array_equal(memory_need(state, GpuRequest(compute=250, memory_mib=None), ALL)[:, :2],
                                  [[4_096, 4_096], [8_192, 8_192], [2_048, 0]])
    np.testing.assert_array_equal(memory_need(state, GpuRequest(compute=0, memory_mib=100), ALL)[:, 0],
                                  [100, 100, 100])
    np.testing.assert_array_equal(memory_need(state, GpuRequest.whole(), ALL)[:, 0], [16_384, 32_768, 8_192])


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        # n0: card 0 has 500 compute / 8192 MiB left; n1: card 0 exclusive; n2: one 8 GiB virtual card
        pytest.param(GpuRequest.fraction(500), [[True, True], [False, True], [True, False]], id="half-card"),
        pytest.param(GpuRequest.fraction(501), [[False, True], [False, True], [True, False]], id="just-over-half"),
        pytest.param(
            GpuRequest(compute=0, memory_mib=8_192), [[True, True], [False, True], [True, False]],
            id="memory-only-fits",
        ),
        pytest.param(
            GpuRequest(compute=0, memory_mib=8_193), [[False, True], [False, True], [False, False]],
            id="memory-only-too-much",
        ),
        pytest.param(GpuRequest.whole(), [[False, True], [False, True], [True, False]], id="whole-card"),
        pytest.param(
            GpuRequest(compute=100, models=frozenset({"B"})), [[False, False], [False, True], [False, False]],
            id="model-b",
        ),
        pytest.param(
            GpuRequest(compute=100, models=frozenset({"A", "B"})), [[True, True], [False, True], [True, False]],
            id="models-a-or-b",
        ),
        pytest.param(
            GpuRequest(compute=100, models=frozenset({"H100"})), [[False, False], [False, False], [False, False]],
            id="model-absent",
        ),
        pytest.param(
            GpuRequest(compute=100, kind=GpuKind.VIRTUAL), [[False, False], [False, False], [True, False]],
            id="virtual-kind",
        ),
        pytest.param(
            GpuRequest(compute=100, kind=GpuKind.PHYSICAL), [[True, True], [False, True], [False, False]],
            id="physical-kind",
        ),
    ],
)
def test_card_fit_mask(state: ClusterState, request_: GpuRequest, expected: list[list[bool]]) -> None:
    mask = card_fit_mask(state, request_, ALL)
    assert mask.shape == (3, state.max_cards)
    assert mask[:, :2].tolist() == expected
    assert not mask[:, 2:].any()  # card slots that do not exist never fit


def test_unhealthy_cards_are_not_eligible(state: ClusterState) -> None:
    state.set_card_health("n0", 1, False)
    assert card_verdicts(state, GpuRequest.fraction(100), rows(0))[0, :2].tolist() == [
        CardVerdict.FITS, CardVerdict.UNHEALTHY]
    assert card_fit_mask(state, GpuRequest.fraction(100), rows(0))[0, :2].tolist() == [True, False]


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(slice_pod("p", 500), [True, True, True], id="half-card"),
        pytest.param(slice_pod("p", 500, count=2), [True, False, False], id="two-half-cards"),
        pytest.param(slice_pod("p", 1000), [True, True, True], id="whole-card"),
        pytest.param(slice_pod("p", 1000, count=2), [False, False, False], id="two-whole-cards"),
        pytest.param(slice_pod("p", 300, models=["B"]), [False, True, False], id="model-b"),
        pytest.param(slice_pod("p", 300, models=["A"]), [True, False, True], id="model-a"),
        # n0 has 4000m CPU
        pytest.param(slice_pod("p", 300, cpu=4_001), [False, True, True], id="cpu-short"),
        # n0 has 8000 MiB memory
        pytest.param(slice_pod("p", 300, memory=8_001), [False, True, True], id="memory-short"),
        pytest.param(
            pod_with("p", GpuRequest(compute=100, kind=GpuKind.VIRTUAL)), [False, False, True],
            id="virtual-kind",
        ),
        pytest.param(pod_with("p", None), [True, True, True], id="no-gpu"),
    ],
)
def test_node_fit_mask(state: ClusterState, pod: PodRequest, expected: list[bool]) -> None:
    assert node_fit_mask(state, pod).tolist() == expected
    assert node_fit_mask(state, pod, rows(2, 0)).tolist() == [expected[2], expected[0]]


def test_node_fit_mask_counts_cards_per_container_and_init_container(state: ClusterState) -> None:
    init_whole = PodRequest(key="p", containers=(ContainerRequest("a", gpu=GpuRequest.fraction(100)),),
                            init_containers=(ContainerRequest("i", gpu=GpuRequest.whole(2)),))
    assert node_fit_mask(state, init_whole).tolist() == [False, False, False]


def test_node_fit_mask_excludes_removed_nodes(state: ClusterState) -> None:
    state.remove_node("n2")
    assert node_fit_mask(state, slice_pod("p", 100)).tolist() == [True, True, False]


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        pytest.param(
            mem_pod("p", 32_769), "container main asks for 32769 MiB on one card; the largest card has 32768 MiB",
            id="card-too-small",
        ),
        pytest.param(
            slice_pod("p", 1000, count=3), "container main asks for 3 cards; the largest node has 2",
            id="too-many-cards",
        ),
        pytest.param(slice_pod("p", 100, models=["H100", "A100"]),
         "container main asks for GPU model(s) A100, H100; the cluster has A, B", id="unknown-models"),
    ],
)
def test_request_problem(state: ClusterState, pod: PodRequest, message: str) -> None:
    assert request_problem(state, pod) == message


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(mem_pod("p", 32_768), id="largest-card"),
        pytest.param(slice_pod("p", 1000, count=2), id="most-cards"),
        pytest.param(slice_pod("p", 100, models=["B", "H100"]), id="one-known-model"),
        pytest.param(pod_with("p", None), id="no-gpu"),
        pytest.param(slice_pod("p", 999), id="just-under-a-card"),
    ],
)
def test_no_request_problem(state: ClusterState, pod: PodRequest) -> None:
    assert request_problem(state, pod) is None


def test_request_problem_checks_init_containers(state: ClusterState) -> None:
    pod = PodRequest(key="p", containers=(ContainerRequest("a"),),
                     init_containers=(ContainerRequest("init", gpu=GpuRequest(compute=0, memory_mib=40_000)),))
    assert request_problem(state, pod) == (
        "container init asks for 40000 MiB on one card; the largest card has 32768 MiB")


def test_request_problem_without_cards() -> None:
    state = ClusterState([make_node("cpu", 0)])
    assert request_problem(state, slice_pod("p", 100)) == "the cluster has no GPU cards"
    assert request_problem(state, pod_with("p", None)) is None


def test_gpushare_filter_example_explains_each_node() -> None:
    """Alibaba's filter example: three nodes of two 16,276 MiB cards and a pod of 8,138 MiB.

    N1 has 4,069 MiB left in total, N2 has 4,069 MiB on each card, N3 has 8,138 MiB on GPU0.
    """
    state = ClusterState([make_node(n, [ALI, ALI]) for n in ("N1", "N2", "N3")])
    book_slice(state, "a", "N1", 0, memory=ALI)
    book_slice(state, "b", "N1", 1, memory=12_207)
    book_slice(state, "c", "N2", 0, memory=12_207)
    book_slice(state, "d", "N2", 1, memory=12_207)
    book_slice(state, "e", "N3", 0, memory=8_138)
    book_slice(state, "f", "N3", 1, memory=ALI)
    pod = mem_pod("p", 8_138)
    assert node_fit_mask(state, pod).tolist() == [False, False, True]
    assert explain_node(state, 0, pod) == "no single card has 8138 MiB free; largest free 4069 MiB"
    assert explain_node(state, 1, pod) == "no single card has 8138 MiB free; largest free 4069 MiB"
    assert explain_node(state, 2, pod) is None


@pytest.mark.parametrize(
    ("pod", "row", "message"),
    [
        pytest.param(
            slice_pod("p", 100, cpu=4_001), 0, "insufficient CPU: 4001m requested, 4000m free",
            id="cpu-short",
        ),
        pytest.param(
            slice_pod("p", 100, memory=9_000), 0, "insufficient memory: 9000 MiB requested, 8000 MiB free",
            id="memory-short",
        ),
        pytest.param(
            slice_pod("p", 100, models=["B"]), 0, "no healthy card of model B (node has A)",
            id="model-absent",
        ),
        pytest.param(
            slice_pod("p", 100, models=["B", "C"]), 2, "no healthy card of model B|C (node has A)",
            id="models-absent",
        ),
        pytest.param(
            pod_with("p", GpuRequest(compute=100, kind=GpuKind.VIRTUAL)), 0, "no healthy card of the requested kind",
            id="kind-absent",
        ),
        pytest.param(
            slice_pod("p", 1000, count=2), 1, "needs 2 idle whole card(s); 1 idle",
            id="n1-other-card-exclusive",
        ),
        pytest.param(slice_pod("p", 1000, count=2), 0, "needs 2 idle whole card(s); 1 idle", id="n0-other-card-shared"),
        pytest.param(
            mem_pod("p", 16_385), 0, "no single card has 16385 MiB free; largest free 16384 MiB",
            id="no-card-with-the-memory",
        ),
        pytest.param(pod_with("p", GpuRequest(count=2, compute=0, memory_mib=9_000)), 0,
         "fewer than 2 cards have 9000 MiB free; largest free 16384 MiB", id="too-few-cards-with-the-memory"),
        pytest.param(pod_with("p", GpuRequest(count=2, compute=600, memory_mib=100)), 0,
         "no card has 60 percent compute free together with the memory; largest free compute 100 percent",
         id="compute-short"),
        pytest.param(slice_pod("p", 500), 0, None, id="fits-slice"),
        pytest.param(slice_pod("p", 1000), 1, None, id="fits-whole"),
    ],
)
def test_explain_node(state: ClusterState, pod: PodRequest, row: int, message: str | None) -> None:
    assert explain_node(state, row, pod) == message


def test_explain_node_compute_shortage() -> None:
    state = ClusterState([make_node("n", 1)])
    book_slice(state, "a", "n", 0, compute=750)
    assert explain_node(state, 0, pod_with("p", GpuRequest(compute=300, memory_mib=10))) == (
        "no card has 30 percent compute free together with the memory; largest free compute 25 percent")


def test_explain_node_unhealthy_and_removed() -> None:
    state = ClusterState([make_node("n", 1, unhealthy=[0]), make_node("m", 1)])
    assert explain_node(state, 0, slice_pod("p", 100)) == "no healthy card of the requested kind"
    state.remove_node("m")
    assert explain_node(state, 1, slice_pod("p", 100)) == "node m is not known to gpupool"
