"""Pods HAMi, gpushare and GPUManager placed: their annotations read into the cards they hold, and
what is booked when an annotation cannot be read (the whole card, or no GPU pod on the node)."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.names import GPUSHARE_UNITS, ResourceNames
from gpupool.core.model import CardSlice, ContainerAssignment
from gpupool.kube.adoption import (
    GPUMANAGER,
    GPUSHARE,
    HAMI,
    Adoption,
    AdoptionError,
    adoption,
)
from gpupool.kube.translate import node_spec
from tests.kube.builders import container, node, pod

NAMES = ResourceNames()
SPEC = node_spec(node("n1", [16384, 16384]), NAMES)
WHOLE = (16384, 1000, True)


def hami_pod(value: str, *containers: dict[str, Any], node_name: str = "n1") -> dict[str, Any]:
    return pod("p", *(containers or (container(nvidia__gpu=1, mib=3000),)), node_name=node_name,
               annotations={"hami.io/vgpu-devices-allocated": value, "hami.io/vgpu-node": "n1",
                            "hami.io/bind-phase": "success"})


def held(found: Adoption | None) -> list[list[tuple[int, int, int, bool]]]:
    """Per container, (card position, MiB, per-mille, exclusive) on node n1."""
    assert found is not None
    placement = found.on("n1").placement("default/p", SPEC, 0, 0)
    return [[(s.card, s.memory_mib, s.compute, s.exclusive) for s in c.slices] for c in placement.containers]


def test_hami_slices_are_booked_per_container_by_card_uuid() -> None:
    raw = hami_pod("GPU-n1-1,NVIDIA,3000,30:;GPU-n1-0,NVIDIA,2000,0:GPU-n1-1,NVIDIA,2000,0:;",
                   container("a", nvidia__gpu=1, mib=3000), container("b", nvidia__gpu=2, mib=2000))
    found = adoption(raw, NAMES)
    assert found is not None and found.system == HAMI and found.problem is None and found.node == "n1"
    assert [c.name for c in found.containers] == ["a", "b"]
    assert held(found) == [[(1, 3000, 300, False)], [(0, 2000, 0, False), (1, 2000, 0, False)]]


def test_hami_keeps_empty_entries_aligned_with_the_containers() -> None:
    raw = hami_pod(";GPU-n1-0,NVIDIA,1000,10:;", container("sidecar"), container("gpu", nvidia__gpu=1, mib=1000))
    found = adoption(raw, NAMES)
    assert found is not None and [c.name for c in found.containers] == ["gpu"]


def test_hami_whole_cards_and_uuids_in_another_case() -> None:
    found = adoption(hami_pod("gpu-N1-0,NVIDIA,16384,100:;"), NAMES)
    assert held(found) == [[(0, *WHOLE)]]


@pytest.mark.parametrize("value", ["GPU-n1-0,NVIDIA,lots,30:;", "GPU-n1-0,NVIDIA:;", "GPU-n1-0,NVIDIA,3000,130:;",
                                   "GPU-n1-0,NVIDIA,0,0:;"])
def test_hami_share_that_cannot_be_read_books_the_whole_card_and_says_so(value: str) -> None:
    found = adoption(hami_pod(value), NAMES)
    assert found is not None and found.problem is not None
    assert "whole card is booked" in found.problem and "GPU-n1-0" in found.problem
    assert held(found) == [[(0, *WHOLE)]]


@pytest.mark.parametrize("value", ["", ";;", ":;", " ,NVIDIA,3000,0:;"])
def test_hami_value_naming_no_card_is_an_error(value: str) -> None:
    with pytest.raises(AdoptionError, match=r"hami\.io/vgpu-devices-allocated"):
        adoption(hami_pod(value), NAMES)


def test_a_card_the_node_does_not_have_is_an_error() -> None:
    found = adoption(hami_pod("GPU-elsewhere-0,NVIDIA,3000,0:;"), NAMES)
    assert found is not None
    with pytest.raises(AdoptionError, match=r"GPU-elsewhere-0.*node n1 does not have"):
        found.placement("default/p", SPEC, 0, 0)


def test_bound_to_another_node_than_hami_chose_books_whole_cards() -> None:
    found = adoption(hami_pod("GPU-n1-0,NVIDIA,3000,0:;"), NAMES)
    assert found is not None
    moved = found.on("n2")
    assert moved.problem is not None and "bound to n2" in moved.problem
    assert [r.memory_mib for c in moved.containers for r in c.cards] == [None]


def gpushare_pod(**annotations: str) -> dict[str, Any]:
    return pod("p", container(**{"aliyun.com/gpu-mem": "4"}), node_name="n1",
               annotations={"ALIYUN_COM_GPU_MEM_ASSIGNED": "true", "ALIYUN_COM_GPU_MEM_DEV": "16", **annotations})


@pytest.mark.parametrize(("unit", "mib"), [("GiB", 4096), ("MiB", 4)])
def test_gpushare_books_the_pods_memory_on_its_card_index(unit: str, mib: int) -> None:
    names = ResourceNames(gpushare_unit_mib=GPUSHARE_UNITS[unit])
    found = adoption(gpushare_pod(ALIYUN_COM_GPU_MEM_IDX="1", ALIYUN_COM_GPU_MEM_POD="4"), names)
    assert found is not None and found.system == GPUSHARE and found.problem is None
    assert held(found) == [[(1, mib, 0, False)]]


@pytest.mark.parametrize("annotations", [{"ALIYUN_COM_GPU_MEM_POD": "x"}, {}, {"ALIYUN_COM_GPU_MEM_POD": "0"}])
def test_gpushare_without_a_readable_amount_books_the_whole_card(annotations: dict[str, str]) -> None:
    found = adoption(gpushare_pod(ALIYUN_COM_GPU_MEM_IDX="0", **annotations), NAMES)
    assert found is not None and found.problem is not None and "ALIYUN_COM_GPU_MEM_POD" in found.problem
    assert held(found) == [[(0, *WHOLE)]]


@pytest.mark.parametrize("index", ["-1", "zero", "", "0,,1"])
def test_gpushare_index_that_is_no_index_is_an_error(index: str) -> None:
    with pytest.raises(AdoptionError, match="ALIYUN_COM_GPU_MEM_IDX"):
        adoption(gpushare_pod(ALIYUN_COM_GPU_MEM_IDX=index, ALIYUN_COM_GPU_MEM_POD="4"), NAMES)


def gpumanager_pod(*containers: dict[str, Any], cards: dict[int, str]) -> dict[str, Any]:
    """A pod GPUManager placed: ``cards`` are the card indices of each container position."""
    return pod("p", *containers, node_name="n1",
               annotations={"tencent.com/gpu-assigned": "true", "tencent.com/predicate-node": "n1",
                            **{f"tencent.com/predicate-gpu-idx-{i}": v for i, v in cards.items()}})


def test_gpumanager_shares_and_whole_cards_per_container() -> None:
    raw = gpumanager_pod(container("a", **{"tencent.com/vcuda-core": 30, "tencent.com/vcuda-memory": 8}),
                         container("b", **{"tencent.com/vcuda-core": 200}),
                         cards={0: "1", 1: "0,1"})
    found = adoption(raw, NAMES)
    assert found is not None and found.system == GPUMANAGER and found.problem is None
    assert held(found) == [[(1, 2048, 300, False)], [(0, *WHOLE), (1, *WHOLE)]]


def test_gpumanager_container_without_amounts_gets_its_cards_whole() -> None:
    raw = gpumanager_pod(container("a"), cards={0: "1", 4: "0"})
    found = adoption(raw, NAMES)
    assert found is not None and found.problem is not None
    assert "container a has no readable" in found.problem and "names no container" in found.problem
    placement = found.placement("default/p", SPEC, 0, 0)
    assert placement.containers == (ContainerAssignment("a", (CardSlice(1, 16384, 1000, True),)),
                                    ContainerAssignment("4", (CardSlice(0, 16384, 1000, True),)))


def test_pods_without_foreign_annotations_adopt_nothing() -> None:
    assert adoption(pod("p", container(mib=1000), node_name="n1"), NAMES) is None
    assert adoption({"metadata": {"annotations": "junk"}}, NAMES) is None
