"""The ``stale-heartbeat`` risk: a registered process holding a card that stopped renewing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpupool.core.model import CardSlice
from gpupool.nodeagent.risk.detector import NodeView, detect
from gpupool.nodeagent.risk.findings import EVENT_REASONS, RiskKind
from tests.nodeagent.risk.world import NOW, holder, pod, view

SHARED = CardSlice(0, 4096, 300)
EXCLUSIVE = CardSlice(1, 15360, 1000, exclusive=True)
TRAIN = pod("train", {"main": (SHARED,)})
WHOLE = pod("whole", {"main": (EXCLUSIVE,)})
REGISTERED = lambda ns, pod, container: frozenset({11, 12})  # noqa: E731


def with_heartbeats(node: NodeView, seen: dict[int, float]) -> NodeView:
    return replace(node, renewed=lambda ns, pod, container: seen, stale_after_s=30.0)


def found(node: NodeView) -> list[tuple[str, int, int]]:
    return [(r.kind.value, r.card, r.pid) for r in detect(node)]


@pytest.mark.parametrize(("seen", "expected"), [
    pytest.param({11: NOW - 5, 12: NOW - 29}, [], id="both-renewing"),
    pytest.param({11: NOW - 5, 12: NOW - 31}, [("stale-heartbeat", 0, 12)], id="one-frozen"),
    pytest.param({11: NOW - 5}, [("unregistered-process", 0, 12)], id="never-registered-is-the-other-kind"),
])
def test_a_registered_holder_that_stopped_renewing_is_a_risk(seen: dict[int, float],
                                                               expected: list[tuple[str, int, int]]) -> None:
    holders = {0: (holder(11, "train", "main"), holder(12, "train", "main"))}
    def registered(_ns: str, _pod: str, _container: str) -> frozenset[int]:
        return frozenset(seen)

    assert found(with_heartbeats(view([TRAIN], holders, registered=registered), seen)) == expected


def test_an_exclusive_card_holder_is_judged_too() -> None:
    node = view([WHOLE], {1: (holder(41, "whole", "main"),)}, registered=lambda *_: frozenset({41}))
    assert found(with_heartbeats(node, {41: NOW - 100})) == [("stale-heartbeat", 1, 41)]


def test_within_the_grace_and_without_the_library_nothing_is_judged() -> None:
    fresh = view([TRAIN], {0: (holder(12, "train", "main", since=NOW - 1),)}, registered=REGISTERED)
    assert found(with_heartbeats(fresh, {12: NOW - 100})) == []
    assert found(view([TRAIN], {0: (holder(12, "train", "main"),)}, registered=REGISTERED)) == []  # renewed None


def test_the_kind_has_an_event_reason() -> None:
    assert EVENT_REASONS[RiskKind.STALE_HEARTBEAT] == "GpuRiskStaleHeartbeat"
    risk = detect(with_heartbeats(view([TRAIN], {0: (holder(12, "train", "main"),)}, registered=REGISTERED),
                                  {12: NOW - 45}))[0]
    assert "has not renewed for 45 s" in risk.message()
