"""The detector on hand-built node views: which holders are risks, and which are not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.nodeagent.risk.detector import NodeView, detect, grants_of
from gpupool.nodeagent.types import ContainerView, NodeAssignment, PodView
from tests.nodeagent.risk.world import CARDS, NODE, NOW, holder, pod, sample, state, view

SHARED = CardSlice(0, 4096, 300)
EXCLUSIVE = CardSlice(1, 15360, 1000, exclusive=True)
TRAIN = pod("train", {"main": (SHARED,)})
WHOLE = pod("whole", {"main": (EXCLUSIVE,)})
WEB = pod("web", None)
NOBODY_REGISTERED = lambda ns, pod, container: frozenset()  # noqa: E731
MAIN_REGISTERED = lambda ns, pod, container: frozenset({11, 12})  # noqa: E731
PERSISTENCED = replace(holder(5), infrastructure="nvidia-persistenced")
"""A host daemon on every card (issues 26/27): never a finding, and its memory is nobody's."""
EXPORTER = replace(holder(6, "dcgm-exporter", "exporter", namespace="gpu-operator"), infrastructure="gpu-operator")
"""The GPU Operator's DCGM exporter, a pod that booked no GPU in an infrastructure namespace (issue 26)."""


def kinds(node: NodeView) -> list[tuple[str, int, str, int]]:
    return [(r.kind.value, r.card, f"{r.pod}/{r.container}", r.pid) for r in detect(node)]


@pytest.mark.parametrize(("node", "expected"), [
    pytest.param(view([TRAIN], {0: (holder(11, "train", "main"),)}), [], id="granted-holder"),
    pytest.param(view([TRAIN, WEB], {0: (holder(11, "train", "main"), holder(21, "web", "app"))}),
                 [("ungranted-card", 0, "web/app", 21)], id="pod-without-gpus-on-a-card"),
    pytest.param(view([TRAIN], {1: (holder(11, "train", "main"),)}),
                 [("ungranted-card", 1, "train/main", 11)], id="granted-another-card"),
    pytest.param(view([TRAIN], {0: (holder(11, "train", "side"),)}),
                 [("ungranted-card", 0, "train/side", 11)], id="another-container-of-the-granted-pod"),
    pytest.param(view([WEB], {0: (holder(21, "web", "app", since=NOW - 1),)}), [], id="within-the-grace"),
    pytest.param(view([], {0: (holder(5),)}), [], id="host-process"),
    pytest.param(view([], {0: (holder(31, "p", ""),)}), [], id="container-not-named-yet"),
    pytest.param(view([TRAIN], {0: (holder(11, "train", "main"), PERSISTENCED), 1: (PERSISTENCED,)},
                      enforcing=False, memory={0: {11: 3000, 5: 9000}, 1: {5: 500}}), [],
                 id="infrastructure-holders"),
    pytest.param(view([TRAIN], {0: (holder(11, "train", "main"), EXPORTER), 1: (EXPORTER,)},
                      enforcing=False, memory={0: {11: 3000, 6: 9000}, 1: {6: 500}}), [],
                 id="infrastructure-pod"),
    pytest.param(view([TRAIN], {1: (replace(EXPORTER, infrastructure=""),)}),
                 [("ungranted-card", 1, "dcgm-exporter/exporter", 6)], id="the-same-pod-not-named-infrastructure"),
])
def test_ungranted_cards(node: NodeView, expected: list[tuple[str, int, str, int]]) -> None:
    assert kinds(node) == expected


@pytest.mark.parametrize(("enforcing", "memory", "expected"), [
    pytest.param(False, {0: {11: 3000, 12: 1500}}, [("over-memory", 0, "train/main", 0)], id="two-processes-over"),
    pytest.param(False, {0: {11: 3000, 12: 1096}}, [], id="exactly-the-limit"),
    pytest.param(False, {0: {11: 3000, 99: 9000}}, [], id="another-pid-on-the-card-does-not-count"),
    pytest.param(True, {0: {11: 9000}}, [("over-memory", 0, "train/main", 0)], id="a-backend-enforces-and-was-passed"),
    pytest.param(False, {}, [], id="not-sampled"),
])
def test_over_memory_whatever_the_backend(enforcing: bool, memory: dict[int, dict[int, int]],
                                          expected: list[tuple[str, int, str, int]]) -> None:
    holders = {0: (holder(11, "train", "main"), holder(12, "train", "main"))}
    node = view([TRAIN], holders, enforcing=enforcing, memory=memory, overhead_mib=0)
    assert kinds(node) == expected


@pytest.mark.parametrize(("pods", "holders", "registered", "expected"), [
    pytest.param([TRAIN], {0: (holder(11, "train", "main"), holder(13, "train", "main"))}, MAIN_REGISTERED,
                 [("unregistered-process", 0, "train/main", 13)], id="one-bypassed-the-library"),
    pytest.param([TRAIN], {0: (holder(11, "train", "main"),)}, MAIN_REGISTERED, [], id="registered"),
    pytest.param([WHOLE], {1: (holder(41, "whole", "main"),)}, NOBODY_REGISTERED, [], id="exclusive-card"),
    pytest.param([TRAIN], {0: (holder(13, "train", "main"),)}, None, [], id="library-not-running"),
])
def test_unregistered_processes_on_shared_cards(pods: list, holders: dict, registered: object,
                                                expected: list[tuple[str, int, str, int]]) -> None:
    assert kinds(view(pods, holders, registered=registered)) == expected  # type: ignore[arg-type]


def test_a_risk_keeps_its_identity_across_rounds_and_a_reused_pid_is_another() -> None:
    first = detect(view([WEB], {0: (holder(21, "web", "app"),)}))
    again = detect(view([WEB], {0: (holder(21, "web", "app"),)}))
    assert [r.key for r in first] == [r.key for r in again]
    reused = holder(21, "web", "app")
    reused = type(reused)(**{**reused.__dict__, "start_time": 999})
    assert detect(view([WEB], {0: (reused,)}))[0].key != first[0].key


def claim_view(claim: str, *slices: CardSlice, namespace: str = "team") -> PodView:
    """A prepared claim as the DRA driver hands it to the agent (ClaimState.as_pods)."""
    placement = Placement(f"{namespace}/claim {claim}", NODE, 0, 0, (ContainerAssignment(claim, slices),))
    return PodView(namespace, f"claim {claim}", f"uid-{claim}", NODE, 0.0, False, (), NodeAssignment(placement, {}))


def dra_pod(name: str, claims: dict[str, tuple[str, ...]], namespace: str = "team") -> PodView:
    """A running pod whose containers use DRA claims (no assignment-v1: the device plugin granted nothing)."""
    return PodView(namespace, name, f"uid-{name}", NODE, 0.0, False,
                   tuple(ContainerView(c, False, {}, claims=used) for c, used in claims.items()))


def test_a_container_using_a_prepared_claim_holds_its_share() -> None:
    """A DRA container's process on its claim's card is granted; the same process on another card,
    or a container of the pod that does not use the claim, is not (the claims were invisible to the
    risk checks: every DRA process looked ungranted)."""
    pods = [dra_pod("infer", {"main": ("infer-gpu",), "sidecar": ()})]
    claims = [claim_view("infer-gpu", CardSlice(0, 4096, 300)), claim_view("other", CardSlice(1, 2048, 0))]
    grants = grants_of(NODE, pods, claims)
    assert grants == {("team", "infer", "main"): {0: CardSlice(0, 4096, 300)}}
    holders = {0: (holder(11, "infer", "main"), holder(12, "infer", "sidecar")), 1: (holder(13, "infer", "main"),)}
    node = NodeView(CARDS, state(holders), sample({}), grants, True, None, NOW)
    assert kinds(node) == [("ungranted-card", 0, "infer/sidecar", 12), ("ungranted-card", 1, "infer/main", 13)]
    # a claim of the same name in another namespace is not this pod's
    assert grants_of(NODE, pods, [claim_view("infer-gpu", CardSlice(0, 4096, 300), namespace="else")]) == {
        ("team", "infer", "main"): {}}


def test_two_claims_on_one_card_add_up_and_an_assignment_still_counts() -> None:
    both = dra_pod("both", {"main": ("a", "b")})
    claims = [claim_view("a", CardSlice(0, 4096, 300)), claim_view("b", CardSlice(0, 2048, 200))]
    assert grants_of(NODE, [both], claims)[("team", "both", "main")] == {0: CardSlice(0, 6144, 500)}
    assert grants_of(NODE, [TRAIN], claims) == grants_of(NODE, [TRAIN])
