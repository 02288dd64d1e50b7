"""``--risk-action refuse-opens`` through the kernel's device gate: the blocked containers' card
files go into the gate as the blocked set changes, and the action counts as enforced with a source
that cannot answer opens (the /proc scan)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime
from gpupool.nodeagent.containers.container_gate import ContainerGate
from gpupool.nodeagent.monitor.service import UsageMonitor
from gpupool.nodeagent.risk.decider import RiskOpenDecider
from gpupool.nodeagent.risk.findings import RiskAction
from gpupool.nodeagent.risk.setup import can_refuse_opens, gate_blocked
from tests.nodeagent.containers.test_container_gate import RecordingGate
from tests.nodeagent.risk.test_responder import WEB, Calls, responder, rounds

CARDS = ("/dev/nvidia0", "/dev/nvidia1")


def monitor_with(can_decide: bool) -> UsageMonitor:
    return cast(UsageMonitor, SimpleNamespace(source=SimpleNamespace(can_decide=can_decide)))


def test_blocked_containers_are_refused_the_cards_by_the_kernel_until_they_are_gone() -> None:
    kernel = RecordingGate()
    gate = ContainerGate(kernel, {"cid-web": "/k8s.io/web"}.get)
    decider = RiskOpenDecider(lambda pid: CgroupIdentity(Runtime.CONTAINERD, "cid-web"))
    scan = monitor_with(can_decide=False)
    assert not can_refuse_opens(decider, scan), "a /proc scan alone refuses nothing"
    gate_blocked(decider, gate, CARDS)
    assert can_refuse_opens(decider, scan)
    calls = Calls()
    rounds(responder(RiskAction.REFUSE_OPENS, calls, decider, can_refuse=can_refuse_opens(decider, scan)), [WEB])
    assert kernel.denied == {("/k8s.io/web", path) for path in CARDS}
    assert "further opens" in calls.events[0][3]
    decider.keep_only([])  # the container is gone
    assert kernel.denied == set()


def test_without_a_decider_nothing_is_refused() -> None:
    assert not can_refuse_opens(None, monitor_with(can_decide=True))
    assert can_refuse_opens(RiskOpenDecider(cast(Any, None)), monitor_with(can_decide=True))
