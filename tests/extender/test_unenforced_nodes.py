"""A node that cannot enforce GPU shares takes whole cards only (docs/isolation-backends.md).

The node agent says so in the ``enforcement-v1`` annotation (:mod:`gpupool.api.enforcement`) and
registers no share resource with kubelet; the extender must then place no slice there (kubelet
would refuse the pod, or, with shares advertised unenforced, the container could take the card),
name the node's reason, and still place whole cards. A node without the annotation keeps shares.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.enforcement import EnforcementNotice, encode_notice
from gpupool.api.names import ResourceNames
from gpupool.extender.cache import ClusterCache
from gpupool.extender.service import ExtenderService
from gpupool.kube.translate import pod_request
from tests.extender.modes import EVERY_FIT
from tests.kube.builders import container, node, pod

NAMES = ResourceNames()
WHOLE_ONLY = EnforcementNotice("none", False, False, "auto: no interception library")
UNENFORCED = EnforcementNotice("none", False, True, "--isolation none: the admin's choice")
ENFORCED = EnforcementNotice("shim", True, True, "auto: the packaged interception library")


def noticed(name: str, notice: EnforcementNotice | str | None) -> dict[str, Any]:
    text = notice if isinstance(notice, str) or notice is None else encode_notice(notice)
    return node(name, [16384, 16384], annotations={NAMES.enforcement: text} if text is not None else None)


def service(*nodes: dict[str, Any]) -> tuple[ClusterCache, ExtenderService]:
    cache = ClusterCache(policy="binpack")
    cache.replace_nodes(list(nodes))
    cache.replace_pods([])
    return cache, ExtenderService(cache, None, settings=EVERY_FIT)


@pytest.mark.parametrize("limits", [
    pytest.param({"gpu_mem": 16}, id="memory-slice"),
    pytest.param({"gpu_core": 30}, id="compute-slice"),
])
def test_no_slice_on_a_node_that_takes_whole_cards_only(limits: dict[str, int]) -> None:
    _, extender = service(noticed("whole", WHOLE_ONLY), noticed("plain", None), noticed("enforced", ENFORCED),
                          noticed("unenforced", UNENFORCED))
    request = pod_request(pod("p", container(**limits)), NAMES)
    outcome = extender.filter(request, ["whole", "plain", "enforced", "unenforced"])
    assert set(outcome.passed) == {"plain", "enforced", "unenforced"}
    reason = outcome.failed["whole"]
    assert "whole GPUs only" in reason and "no interception library" in reason and "%" not in reason


@pytest.mark.parametrize("limits", [
    pytest.param({"gpu": 2}, id="whole-cards"),
    pytest.param({"gpu_core": 100}, id="a-whole-card-by-compute"),
])
def test_whole_cards_are_still_placed_there(limits: dict[str, int]) -> None:
    """Whole cards need no enforcement (the card is the container's alone), by any name."""
    _, extender = service(noticed("whole", WHOLE_ONLY))
    outcome = extender.filter(pod_request(pod("p", container(**limits)), NAMES), ["whole"])
    assert outcome.passed == ["whole"] and outcome.error == ""


@pytest.mark.parametrize("text", ["{not json", '{"backend": "", "enforcing": 1}', "[]"])
def test_an_unreadable_notice_refuses_slices_with_the_annotation_named(text: str) -> None:
    _, extender = service(noticed("odd", text))
    outcome = extender.filter(pod_request(pod("p", container(gpu_mem=4)), NAMES), ["odd"])
    assert outcome.passed == [] and NAMES.enforcement in outcome.failed["odd"]
    assert extender.filter(pod_request(pod("q", container(gpu=1)), NAMES), ["odd"]).passed == ["odd"]


def test_the_refusal_follows_the_node_when_its_agent_gains_a_backend() -> None:
    cache, extender = service(noticed("n", WHOLE_ONLY))
    request = pod_request(pod("p", container(gpu_mem=4)), NAMES)
    assert extender.filter(request, ["n"]).passed == []
    cache.upsert_node(noticed("n", ENFORCED))
    assert extender.filter(request, ["n"]).passed == ["n"] and not cache.share_refusals
    cache.upsert_node(noticed("n", WHOLE_ONLY))
    cache.remove_node("n")
    assert not cache.share_refusals
