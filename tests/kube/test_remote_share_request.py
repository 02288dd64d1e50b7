"""A remote-share pod's request as the extender and the admission webhooks read it
(gpupool/kube/translate.py): the annotation makes the one GPU container's share remote, or the pod
is refused with the reason."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.names import ResourceNames
from gpupool.kube.translate import TranslationError, pod_request
from tests.kube.builders import container, pod

NAMES = ResourceNames()
ASK = {"gpupool.io/remote-gpu": "true"}
TWO_SLICES: dict[str, str | int] = {"gpupool.io/gpu-shared": 2, "gpupool.io/gpu-mem": 16}


def test_the_annotation_makes_the_request_remote() -> None:
    assert pod_request(pod("p", container(mib=4000, cpu="1"), annotations=ASK), NAMES).remote
    assert not pod_request(pod("p", container(mib=4000)), NAMES).remote


def test_the_annotation_on_a_pod_without_gpus_asks_nothing() -> None:
    assert not pod_request(pod("p", container(cpu="1"), annotations=ASK), NAMES).remote


@pytest.mark.parametrize(("raw", "words"), [
    (pod("p", container(mib=4000), annotations={"gpupool.io/remote-gpu": "yes"}),
     'gpupool.io/remote-gpu must be "true" or "false"'),
    (pod("p", container("a", mib=4000), container("b", mib=4000), annotations=ASK),
     "gpupool.io/remote-gpu: a remote share is one container's; 2 containers ask for GPUs"),
    (pod("p", container(gpu=17), annotations=ASK), "a remote share is 1 to 16 cards of one GPU node"),
    (pod("p", container("main", **TWO_SLICES), annotations={**ASK, "gpupool.io/virtual-cards": "shared"}),
     "a remote share has no virtual cards"),
])
def test_a_request_gpupool_cannot_serve_remotely_is_refused_with_the_reason(raw: dict[str, Any], words: str) -> None:
    with pytest.raises(TranslationError, match=words):
        pod_request(raw, NAMES)


def test_a_slice_on_two_cards_or_two_whole_cards_may_be_remote() -> None:
    """gpu-shared: 2 (the same 4 GiB slice on two cards) and gpu: 2 (two whole cards): one GPU
    node's cards, seen by the client as two devices."""
    shared = pod_request(pod("p", container("main", **TWO_SLICES), annotations=ASK), NAMES)
    assert shared.remote and shared.containers[0].gpu is not None
    assert (shared.containers[0].gpu.count, shared.containers[0].gpu.memory_mib) == (2, 4_096)
    whole = pod_request(pod("p", container(gpu=2), annotations=ASK), NAMES)
    assert whole.remote and whole.containers[0].gpu is not None and whole.containers[0].gpu.count == 2
