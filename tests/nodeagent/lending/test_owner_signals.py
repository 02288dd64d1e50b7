"""Reading one container's signals (region, NVML processes) and the streak that says an owner is back."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.nodeagent.lending.options import ActivityThresholds
from gpupool.nodeagent.lending.owner_activity import ActivityTracker
from gpupool.nodeagent.lending.owner_signals import RegionSignals, Signal, Source, nvml_signal
from gpupool.nodeagent.monitor.usage_sampling import CardUsage, ProcessUsage
from tests.nodeagent.lending.regions import region_bytes, write_region

KEY = (0, 100.0, ("ns", "owner", "c"))


def test_a_region_gives_the_card_at_the_containers_ordinal(tmp_path: Path) -> None:
    path = write_region(tmp_path, "uid-o", {0: (512, 3), 1: (4096, 77)})
    assert RegionSignals().signal(path, 1, 16384) == Signal(Source.REGION, 77, 4096)
    assert RegionSignals().signal(path, 0, None) == Signal(Source.REGION, 3, 512)


@pytest.mark.parametrize("content", [
    pytest.param(None, id="missing"),
    pytest.param(b"", id="empty"),
    pytest.param(b"\x00" * 100, id="too-short"),
    pytest.param(b"\xff" * len(region_bytes({})), id="wrong-magic"),
    pytest.param(region_bytes({0: (512, 250)}), id="above-100-percent"),
    pytest.param(region_bytes({0: (99_999, 50)}), id="more-memory-than-the-card"),
])
def test_a_broken_or_missing_region_gives_no_signal_and_does_not_raise(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "memory.region"
    if content is not None:
        path.write_bytes(content)
    signals = RegionSignals()
    assert signals.signal(path, 0, 16384) is None
    assert signals.signal(path, 0, 16384) is None  # and again (logged once)


def test_a_region_that_is_a_directory_gives_no_signal(tmp_path: Path) -> None:
    (tmp_path / "memory.region").mkdir()
    assert RegionSignals().signal(tmp_path / "memory.region", 0, None) is None


def test_an_ordinal_outside_the_region_gives_no_signal(tmp_path: Path) -> None:
    assert RegionSignals().signal(write_region(tmp_path, "u", {}), 99, None) is None


def test_nvml_sums_the_wanted_processes_only() -> None:
    card = CardUsage(0, 90, 6000, 16384, (ProcessUsage(100, 1000, 20), ProcessUsage(101, 500, None),
                                           ProcessUsage(200, 4000, 70)))
    assert nvml_signal(card, [100, 101]) == Signal(Source.NVML, 20, 1500)
    assert nvml_signal(card, [101]) == Signal(Source.NVML, None, 500)
    assert nvml_signal(card, [300]) is None
    assert nvml_signal(None, [100]) is None


def compute(percent: int) -> list[Signal]:
    return [Signal(Source.REGION, percent, 100)]


def memory(mib: int, source: Source = Source.NVML) -> list[Signal]:
    return [Signal(source, None, mib)]


@pytest.mark.parametrize(("samples", "card_percent", "expected"), [
    pytest.param([compute(50)] * 3, 60, [False, False, True], id="computing-3-samples"),
    pytest.param([compute(50)] * 2, 60, [False, False], id="2-samples-are-not-enough"),
    pytest.param([compute(50), compute(0), compute(50), compute(50)], 60, [False] * 4, id="a-quiet-sample-resets"),
    pytest.param([compute(9)] * 5, 60, [False] * 5, id="below-the-percent"),
    pytest.param([compute(80)] * 5, 5, [False] * 5, id="the-card-is-not-that-busy-(stale-region)"),
    pytest.param([compute(80)] * 5, None, [False] * 5, id="card-not-sampled"),
    pytest.param([memory(2048), memory(2304), memory(2304), memory(2304)], 0, [False, False, False, True],
                 id="memory-grew-by-the-threshold"),
    pytest.param([memory(2048), memory(2200), memory(2200), memory(2200)], 0, [False] * 4, id="memory-grew-less"),
    pytest.param([memory(3000), memory(1000), memory(1300), memory(1300), memory(1300)], 0,
                 [False, False, False, False, True], id="growth-from-the-lowest-seen"),
    pytest.param([memory(2048, Source.REGION), memory(4000, Source.NVML)] * 2, 0, [False] * 4,
                 id="each-source-has-its-own-baseline"),
    pytest.param([[]] * 5, 100, [False] * 5, id="no-signal-is-never-activity"),
])
def test_the_streak(samples: list[list[Signal]], card_percent: int | None, expected: list[bool]) -> None:
    tracker = ActivityTracker(ActivityThresholds(percent=10, memory_mib=256, samples=3))
    assert [tracker.observe(KEY, s, card_percent) for s in samples] == expected


def test_the_streak_starts_again_after_it_fired_and_a_forgotten_owner_starts_afresh() -> None:
    tracker = ActivityTracker(ActivityThresholds(samples=2))
    assert [tracker.observe(KEY, compute(90), 90) for _ in range(4)] == [False, True, False, True]
    tracker.observe(KEY, memory(1000), 0)
    tracker.keep([])
    assert not tracker.observe(KEY, memory(2000), 0)  # the baseline went with the loan


@pytest.mark.parametrize("kwargs", [pytest.param({"percent": 0}, id="percent-0"),
                                    pytest.param({"percent": 101}, id="percent-101"),
                                    pytest.param({"memory_mib": 0}, id="memory-0"),
                                    pytest.param({"samples": 0}, id="samples-0")])
def test_thresholds_out_of_range_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="owner activity"):
        ActivityThresholds(**kwargs)
