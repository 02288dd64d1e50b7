"""The detector on hand-built node views: which holders are risks, and which are not."""

from __future__ import annotations

import pytest

from gpupool.core.model import CardSlice
from gpupool.nodeagent.risk.detector import NodeView, detect
from tests.nodeagent.risk.world import NOW, holder, pod, view

SHARED = CardSlice(0, 4096, 300)
EXCLUSIVE = CardSlice(1, 15360, 1000, exclusive=True)
TRAIN = pod("train", {"main": (SHARED,)})
WHOLE = pod("whole", {"main": (EXCLUSIVE,)})
WEB = pod("web", None)
NOBODY_REGISTERED = lambda ns, pod, container: frozenset()  # noqa: E731
MAIN_REGISTERED = lambda ns, pod, container: frozenset({11, 12})  # noqa: E731


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
