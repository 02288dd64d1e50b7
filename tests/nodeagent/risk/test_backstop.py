"""The over-grant backstop and the tamper check on hand-built node views (the driver's figures by pid)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from gpupool.core.model import CardSlice
from gpupool.nodeagent.risk.backstop import MAX_SAMPLE_AGE_S
from gpupool.nodeagent.risk.confirm import Confirmation
from gpupool.nodeagent.risk.detector import ContainerName, NodeView, detect
from gpupool.nodeagent.risk.findings import EVENT_REASONS, RiskKind
from tests.nodeagent.risk.world import NOW, holder, pod, view

GRANT = CardSlice(0, 4096, 300)
TRAIN = pod("train", {"main": (GRANT,), "side": (CardSlice(0, 2048, 100),)})
WEB = pod("web", {"app": (CardSlice(0, 8192, 300),)})
TOLERANCE = 512
BOTH_REGISTERED = lambda ns, pod, container: frozenset({11, 12})  # noqa: E731
ONE_REGISTERED = lambda ns, pod, container: frozenset({11})  # noqa: E731


def found(node: NodeView) -> list[tuple[str, str, int]]:
    return [(r.kind.value, f"{r.pod}/{r.container}", r.pid) for r in detect(node) if r.kind in
            (RiskKind.OVER_MEMORY, RiskKind.REGION_TAMPERED)]


def regions(figures: Mapping[ContainerName, Mapping[int, int] | None]) -> tuple[list[ContainerName], object]:
    """A region reader answering ``figures`` and recording whom it was asked about."""
    asked: list[ContainerName] = []

    def use(name: ContainerName) -> Mapping[int, int] | None:
        asked.append(name)
        return figures.get(name)

    return asked, use


MAIN = {0: (holder(11, "train", "main"), holder(12, "train", "main"))}


@pytest.mark.parametrize(("memory", "expected"), [
    pytest.param({11: 4096 + TOLERANCE}, [], id="one-process-within-grant-plus-its-context"),
    pytest.param({11: 4096 + TOLERANCE + 1}, [("over-memory", "train/main", 0)], id="one-process-one-mib-past"),
    pytest.param({11: 4000, 12: 1120}, [], id="two-processes-two-contexts"),
    pytest.param({11: 4000, 12: 1121}, [("over-memory", "train/main", 0)], id="two-processes-past"),
    pytest.param({11: 4609, 12: 0}, [("over-memory", "train/main", 0)], id="a-process-holding-nothing-earns-no-slack"),
    pytest.param({11: 14000, 99: 3000}, [("over-memory", "train/main", 0)], id="library-bypassed"),
])
def test_the_tolerance_is_per_process_holding_memory(memory: dict[int, int], expected: list[object]) -> None:
    assert found(view([TRAIN], MAIN, memory={0: memory}, overhead_mib=TOLERANCE)) == expected


def test_an_over_grant_names_both_figures_and_that_the_backend_was_passed() -> None:
    [risk] = detect(view([TRAIN], MAIN, memory={0: {11: 9000}}, overhead_mib=TOLERANCE))
    assert risk.kind is RiskKind.OVER_MEMORY and risk.pid == 0 and (risk.namespace, risk.pod) == ("team", "train")
    assert "use 9000 MiB, above the grant's 4096 MiB" in risk.message()
    assert "4608 MiB allowed" in risk.message() and "got past it" in risk.message()


def test_other_containers_processes_are_never_charged_to_this_one() -> None:
    holders = {0: (holder(11, "train", "main"), holder(21, "train", "side"), holder(31, "web", "app"))}
    memory = {0: {11: 4000, 21: 2500, 31: 8000}}  # each within its own grant (+ context) but not the main's
    assert found(view([TRAIN, WEB], holders, memory=memory, overhead_mib=TOLERANCE)) == []
    memory = {0: {11: 4000, 21: 2500, 31: 9000}}
    assert found(view([TRAIN, WEB], holders, memory=memory, overhead_mib=TOLERANCE)) == [
        ("over-memory", "web/app", 0)]


@pytest.mark.parametrize("memory", [
    pytest.param({99: 90000}, id="a-pid-nvml-lists-that-no-holder-is"),
    pytest.param({}, id="holders-nvml-does-not-list-(gone)"),
])
def test_a_vanished_process_is_no_false_positive(memory: dict[int, int]) -> None:
    assert found(view([TRAIN], MAIN, memory={0: memory}, overhead_mib=TOLERANCE)) == []


def test_a_stale_sample_is_not_judged() -> None:
    memory = {0: {11: 9000}}
    assert found(view([TRAIN], MAIN, memory=memory, sampled_at=NOW - MAX_SAMPLE_AGE_S - 1)) == []
    assert found(view([TRAIN], MAIN, memory=memory, sampled_at=NOW - 1)) == [("over-memory", "train/main", 0)]


def test_memory_is_judged_at_once_without_the_grace() -> None:
    fresh = {0: (holder(11, "train", "main", since=NOW),)}
    assert found(view([TRAIN], fresh, memory={0: {11: 9000}})) == [("over-memory", "train/main", 0)]


@pytest.mark.parametrize(("registered", "accounted", "memory", "expected"), [
    pytest.param(BOTH_REGISTERED, 3000, {11: 2000, 12: 1500}, [], id="region-matches-the-driver"),
    pytest.param(BOTH_REGISTERED, 2500, {11: 2500, 12: 1024}, [], id="short-by-the-contexts-only"),
    pytest.param(BOTH_REGISTERED, 0, {11: 2000, 12: 1500}, [("region-tampered", "train/main", 0)], id="zeroed"),
    pytest.param(ONE_REGISTERED, 0, {11: 400, 12: 3000}, [], id="only-an-unregistered-process-holds-memory"),
    pytest.param(BOTH_REGISTERED, None, {11: 2000, 12: 1500}, [], id="region-unreadable"),
])
def test_a_region_written_down_is_its_own_risk(registered: object, accounted: int | None, memory: dict[int, int],
                                               expected: list[object]) -> None:
    _, use = regions({("team", "train", "main"): None if accounted is None else {0: accounted}})
    node = view([TRAIN], MAIN, memory={0: memory}, registered=registered,  # type: ignore[arg-type]
                overhead_mib=TOLERANCE, region=use)  # type: ignore[arg-type]
    assert found(node) == expected


def test_the_tamper_risk_names_both_figures() -> None:
    _, use = regions({("team", "train", "main"): {0: 0}})
    node = view([TRAIN], MAIN, memory={0: {11: 2000, 12: 1500}}, registered=BOTH_REGISTERED,
                overhead_mib=TOLERANCE, region=use)  # type: ignore[arg-type]
    [risk] = [r for r in detect(node) if r.kind is RiskKind.REGION_TAMPERED]
    assert "0 MiB in its accounting region" in risk.message() and "reports 3500 MiB" in risk.message()
    assert EVENT_REASONS[risk.kind] == "GpuRiskRegionTampered"


def test_a_region_is_read_only_when_registered_processes_hold_more_than_their_contexts() -> None:
    asked, use = regions({})
    node = view([TRAIN], MAIN, memory={0: {11: 300, 12: 500}}, registered=BOTH_REGISTERED,
                overhead_mib=TOLERANCE, region=use)  # type: ignore[arg-type]
    assert found(node) == [] and asked == []


def test_a_tamper_finding_waits_for_a_second_sample() -> None:
    _, use = regions({("team", "train", "main"): {0: 0}})
    node = view([TRAIN], MAIN, memory={0: {11: 2000, 12: 1500}}, registered=BOTH_REGISTERED,
                overhead_mib=TOLERANCE, region=use)  # type: ignore[arg-type]
    over = view([TRAIN], MAIN, memory={0: {11: 9000}}, overhead_mib=TOLERANCE)
    confirm = Confirmation()
    risks = detect(node)
    assert [r.kind for r in confirm.filter(risks, 1.0)] == []  # a stale driver figure could explain it
    assert [r.kind for r in confirm.filter(risks, 1.0)] == []  # the same sample again proves nothing
    assert [r.kind for r in confirm.filter(risks, 2.0)] == [RiskKind.REGION_TAMPERED]
    assert [r.kind for r in confirm.filter(detect(over), 3.0)] == [RiskKind.OVER_MEMORY]  # never held back
    assert confirm.filter(risks, 4.0) == []  # it went away in between: it starts over
