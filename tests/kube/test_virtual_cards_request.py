"""The pod annotation ``gpupool.io/virtual-cards``: which requests it turns into virtual-card ones,
and the clear errors for those it cannot serve."""

from __future__ import annotations

import pytest

from gpupool.api.names import ResourceNames
from gpupool.core.model import GpuRequest, VirtualCards
from gpupool.kube.translate import TranslationError, pod_request
from tests.kube.builders import container, pod

NAMES = ResourceNames()
ANNOTATION = "gpupool.io/virtual-cards"


def gpu_of(limits: dict[str, str | int], mode: str | None) -> GpuRequest | None:
    annotations = {ANNOTATION: mode} if mode is not None else None
    return pod_request(pod("p", container("main", **limits), annotations=annotations), NAMES).containers[0].gpu


SLICE_OF_TWO: dict[str, str | int] = {"gpupool.io/gpu-shared": 2, "gpupool.io/gpu-mem": 16}


@pytest.mark.parametrize("mode", ["shared", "exclusive"])
def test_a_slice_of_several_cards_takes_the_mode(mode: str) -> None:
    found = gpu_of(SLICE_OF_TWO, mode)
    assert found == GpuRequest(count=2, memory_mib=4_096, virtual=VirtualCards(mode))


def test_without_the_annotation_nothing_is_virtual() -> None:
    found = gpu_of(SLICE_OF_TWO, None)
    assert found is not None and found.virtual is None


def test_a_one_card_slice_is_left_as_it_is() -> None:
    found = gpu_of({"gpupool.io/gpu-mem": 16}, "shared")
    assert found == GpuRequest(count=1, memory_mib=4_096)


@pytest.mark.parametrize(("limits", "mode", "words"), [
    pytest.param(SLICE_OF_TWO, "yes", "must be one of shared, exclusive, got 'yes'", id="unknown-mode"),
    pytest.param({"gpupool.io/gpu": 2}, "shared", "not 2 whole cards; ask gpupool.io/gpu-shared: 2",
                 id="whole-cards"),
    pytest.param({"gpupool.io/gpu-shared": 17, "gpupool.io/gpu-mem": 4}, "shared", "virtual cards serve a slice "
                 "of 2..16 cards", id="more-devices-than-one-card-is-presented-as"),
])
def test_what_cannot_be_served_is_refused_by_name(limits: dict[str, str | int], mode: str, words: str) -> None:
    with pytest.raises(TranslationError, match=words) as caught:
        gpu_of(limits, mode)
    assert ANNOTATION in str(caught.value)


def test_gpushare_cards_spread_by_the_count_label_can_be_virtual() -> None:
    raw = pod("p", container("main", **{"aliyun.com/gpu-mem": 8}), annotations={ANNOTATION: "shared"})
    raw["metadata"]["labels"] = {"aliyun.com/gpu-count": "2"}
    found = pod_request(raw, NAMES).containers[0].gpu
    assert found is not None and (found.count, found.memory_mib, found.virtual) == (2, 4_096, VirtualCards.SHARED)
