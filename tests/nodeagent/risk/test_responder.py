"""The responder: one event and count per new risk, the policy's action, and its fallbacks."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime
from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind, Verdict
from gpupool.nodeagent.risk.decider import RiskOpenDecider, chain_deciders
from gpupool.nodeagent.risk.findings import Risk, RiskAction, RiskKind
from gpupool.nodeagent.risk.responder import RiskResponder

WEB = Risk(RiskKind.UNGRANTED_CARD, 0, "team", "web", "app", "cid-web", 21, 210, "holds the card")
WEB_TOO = Risk(RiskKind.UNGRANTED_CARD, 1, "team", "web", "app", "cid-web", 22, 220, "holds the card")
TRAIN = Risk(RiskKind.OVER_MEMORY, 1, "team", "train", "main", "cid-train", 0, 0, "use 9000 MiB")


class Calls:
    """Records what the responder asked for."""

    def __init__(self, refuse_eviction: bool = False) -> None:
        self.events: list[tuple[str, str, str, str]] = []
        self.evicted: list[tuple[str, str]] = []
        self.cordons: list[dict[int, str]] = []
        self.refuse_eviction = refuse_eviction

    async def post(self, namespace: str, pod: str, reason: str, message: str) -> None:
        self.events.append((namespace, pod, reason, message))

    async def evict(self, namespace: str, pod: str) -> None:
        if self.refuse_eviction:
            raise RuntimeError("Cannot evict pod as it would violate the pod's disruption budget.")
        self.evicted.append((namespace, pod))

    async def cordon(self, cards: Mapping[int, str]) -> None:
        self.cordons.append(dict(cards))


def responder(action: RiskAction, calls: Calls, decider: RiskOpenDecider | None = None,
              can_refuse: bool = True) -> RiskResponder:
    return RiskResponder(action, calls.post, decider=decider, can_refuse=lambda: can_refuse, evict=calls.evict,
                         cordon=calls.cordon)


def rounds(responder: RiskResponder, *risks: list[Risk]) -> list[list[Risk]]:
    async def run() -> list[list[Risk]]:
        return [await responder.observe(r) for r in risks]
    return asyncio.run(run())


def test_report_posts_one_warning_per_new_risk_and_counts_it() -> None:
    calls = Calls()
    r = responder(RiskAction.REPORT, calls)
    assert rounds(r, [WEB], [WEB, TRAIN], [TRAIN], [WEB]) == [[WEB], [TRAIN], [], [WEB]]
    assert [(e[1], e[2]) for e in calls.events] == [("web", "GpuRiskUngrantedCard"), ("train", "GpuRiskOverMemory"),
                                                    ("web", "GpuRiskUngrantedCard")]
    assert "GPU 0: app (pid 21) holds the card; action: report" in calls.events[0][3]
    assert r.stats.detected[(RiskKind.UNGRANTED_CARD, RiskAction.REPORT)] == 2
    assert calls.evicted == [] and calls.cordons == []


def test_refuse_opens_blocks_the_container_where_the_source_can_refuse() -> None:
    calls = Calls()
    decider = RiskOpenDecider(lambda pid: CgroupIdentity(Runtime.CONTAINERD, "cid-web" if pid < 100 else "cid-x"))
    rounds(responder(RiskAction.REFUSE_OPENS, calls, decider), [WEB])
    assert set(decider.blocked) == {"cid-web"}
    assert decider(DeviceEvent(EventKind.OPEN, "/dev/nvidia0", 23, 0.0)) is Verdict.DENY  # same container
    assert decider(DeviceEvent(EventKind.OPEN, "/dev/nvidia0", 123, 0.0)) is Verdict.ALLOW  # another
    assert decider(DeviceEvent(EventKind.CLOSE, "/dev/nvidia0", 23, 0.0)) is Verdict.ALLOW
    assert decider.denied == 1 and "further opens" in calls.events[0][3]
    decider.keep_only([])  # the container is gone
    assert decider(DeviceEvent(EventKind.OPEN, "/dev/nvidia0", 23, 0.0)) is Verdict.ALLOW


def test_refuse_opens_falls_back_to_report_with_an_observing_source() -> None:
    calls = Calls()
    decider = RiskOpenDecider(lambda pid: CgroupIdentity(Runtime.CONTAINERD, "cid-web"))
    r = responder(RiskAction.REFUSE_OPENS, calls, decider, can_refuse=False)
    rounds(r, [WEB])
    assert decider.blocked == {} and "report only" in calls.events[0][3]
    assert r.stats.detected[(RiskKind.UNGRANTED_CARD, RiskAction.REPORT)] == 1


def test_evict_evicts_each_pod_once_and_reports_a_refusal() -> None:
    calls = Calls()
    r = responder(RiskAction.EVICT, calls)
    rounds(r, [WEB], [WEB, WEB_TOO])
    assert calls.evicted == [("team", "web")]
    refused = Calls(refuse_eviction=True)
    r = responder(RiskAction.EVICT, refused)
    rounds(r, [WEB])
    assert "eviction refused (Cannot evict pod" in refused.events[0][3]
    assert r.stats.eviction_failures == 1 and r.stats.detected[(RiskKind.UNGRANTED_CARD, RiskAction.REPORT)] == 1


def test_cordon_holds_a_card_while_a_risk_remains_on_it() -> None:
    calls = Calls()
    r = responder(RiskAction.CORDON_CARD, calls)
    rounds(r, [WEB], [WEB, TRAIN], [TRAIN], [TRAIN], [])
    assert [sorted(c) for c in calls.cordons] == [[0], [0, 1], [1], []]
    assert "train" in calls.cordons[1][1]


def test_the_action_needs_its_port() -> None:
    with pytest.raises(ValueError, match="eviction"):
        RiskResponder(RiskAction.EVICT, Calls().post)
    with pytest.raises(ValueError, match="cordon"):
        RiskResponder(RiskAction.CORDON_CARD, Calls().post)


def test_a_failed_event_does_not_undo_the_action() -> None:
    calls = Calls()

    async def failing(namespace: str, pod: str, reason: str, message: str) -> None:
        raise ConnectionError("apiserver away")

    r = RiskResponder(RiskAction.EVICT, failing, evict=calls.evict)
    rounds(r, [WEB])
    assert calls.evicted == [("team", "web")] and r.stats.event_failures == 1


def test_chained_deciders_first_denial_wins_and_a_failing_one_allows() -> None:
    event = DeviceEvent(EventKind.OPEN, "/dev/nvidia0", 1, 0.0)

    def deny(e: DeviceEvent) -> Verdict:
        return Verdict.DENY

    def allow(e: DeviceEvent) -> Verdict:
        return Verdict.ALLOW

    def broken(e: DeviceEvent) -> Verdict:
        raise RuntimeError("bug")

    assert chain_deciders(allow, deny)(event) is Verdict.DENY
    assert chain_deciders(broken, allow)(event) is Verdict.ALLOW
    assert chain_deciders(broken, deny)(event) is Verdict.DENY
