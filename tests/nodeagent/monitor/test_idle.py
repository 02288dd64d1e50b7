"""The idle rule: its transition table, and a day of scripted usage replayed in well under a second."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind
from gpupool.nodeagent.monitor.idle import CardActivity, IdleDetector, step
from gpupool.nodeagent.monitor.recorder import UsageRecorder
from gpupool.nodeagent.monitor.scripted_usage import ScriptedUsage, UsageScriptError, parse_duration
from gpupool.nodeagent.monitor.state_file import StateFile
from gpupool.nodeagent.monitor.usage_sampling import UsageSample
from gpupool.nodeagent.monitor.usage_state import DeviceState, DeviceUsage, Holder, UsageState
from tests.nodeagent.monitor.fake_processes import FakeProcesses

FREE, BUSY, IDLE = DeviceState.FREE, DeviceState.BUSY, DeviceState.IDLE
TEN_MINUTES = 600.0


@pytest.mark.parametrize("previous, held, active, last_open, now, expected", [
    pytest.param(CardActivity(BUSY, 5.0), False, True, None, 100.0, CardActivity(FREE, 5.0), id="no-holder-is-free"),
    pytest.param(CardActivity(IDLE, 5.0), True, True, None, 900.0, CardActivity(BUSY, 900.0),
                 id="activity-wakes-an-idle-card"),
    pytest.param(CardActivity(FREE, None), True, False, None, 50.0, CardActivity(BUSY, 50.0),
                 id="taking-a-card-counts-as-use"),
    pytest.param(CardActivity(BUSY, 0.0), True, False, None, 599.0, CardActivity(BUSY, 0.0),
                 id="quiet-less-than-the-idle-time"),
    pytest.param(CardActivity(BUSY, 0.0), True, False, None, 600.0, CardActivity(IDLE, 0.0),
                 id="quiet-for-the-idle-time"),
    pytest.param(CardActivity(IDLE, 0.0), True, False, 700.0, 800.0, CardActivity(BUSY, 700.0),
                 id="a-new-open-wakes-an-idle-card"),
    pytest.param(CardActivity(BUSY, 700.0), True, False, 700.0, 1300.0, CardActivity(IDLE, 700.0),
                 id="an-old-open-does-not-count-twice"),
])
def test_transitions(previous: CardActivity, held: bool, active: bool, last_open: float | None, now: float,
                     expected: CardActivity) -> None:
    assert step(previous, held=held, active=active, last_open=last_open, now=now, idle_after=TEN_MINUTES) == expected


DAY = """
cards: [{memoryMiB: 16384}, {memoryMiB: 16384}]
usage:
  - {at: 0,     card: 0, utilization: 85, processes: [{pid: 100, memoryMiB: 4000, sm: 85}]}
  - {at: 2h,    card: 0, utilization: 0,  processes: [{pid: 100, memoryMiB: 4000, sm: 0}]}
  - {at: 5h,    card: 0, utilization: 40, processes: [{pid: 100, memoryMiB: 4000, sm: 40}]}
  - {at: 5h1m,  card: 0, utilization: 0,  processes: [{pid: 100, memoryMiB: 4000, sm: 0}]}
  - {at: 3h,    card: 1, utilization: 0,  processes: [{pid: 200, memoryMiB: 100}]}
"""


def _usage(cards: int, held: dict[int, tuple[int, float]]) -> UsageState:
    """``cards`` device files; ``held`` maps a card to its holder's pid and open time."""
    devices = []
    for index in range(cards):
        pid, opened = held.get(index, (0, 0.0))
        devices.append(DeviceUsage(f"/dev/nvidia{index}", (Holder(pid, 1, opened),), opened, BUSY) if pid
                       else DeviceUsage(f"/dev/nvidia{index}"))
    return UsageState("n1", 0.0, tuple(devices))


def test_a_day_of_scripted_usage(tmp_path: Path) -> None:
    script = tmp_path / "gpus.yaml"
    script.write_text(DAY)
    clock = [0.0]
    usage = ScriptedUsage.from_file(script, lambda: clock[0])
    detector = IdleDetector({"/dev/nvidia0": 0, "/dev/nvidia1": 1}, idle_after=TEN_MINUTES)
    transitions: list[tuple[int, str, DeviceState]] = []
    for second in range(0, 24 * 3600, 60):
        clock[0] = float(second)
        # card 0 held from the start until 20h; card 1 from 3h on by a process that never computes
        held = {}
        if second < 20 * 3600:
            held[0] = (100, 0.0)
        if second >= 3 * 3600:
            held[1] = (200, 3 * 3600.0)
        state = _usage(2, held)
        for path, new in detector.observe(state, usage.sample()).items():
            transitions.append((second // 60, path, new))
    assert transitions == [  # minutes of the day
        (0, "/dev/nvidia0", BUSY),
        (129, "/dev/nvidia0", IDLE),   # last activity in the sample of 1h59m, idle 10 min later
        (180, "/dev/nvidia1", BUSY),   # taken at 3h by a process that never computes
        (190, "/dev/nvidia1", IDLE),
        (300, "/dev/nvidia0", BUSY),   # one minute of work at 5h
        (310, "/dev/nvidia0", IDLE),
        (1200, "/dev/nvidia0", FREE),  # released at 20h
    ]
    assert detector.idle_seconds("/dev/nvidia1", clock[0]) == pytest.approx(24 * 3600 - 60 - 3 * 3600)


def test_a_card_missing_from_a_sample_is_never_made_idle() -> None:
    detector = IdleDetector({"/dev/nvidia0": 0}, idle_after=TEN_MINUTES)
    state = _usage(1, {0: (100, 0.0)})
    for now in (0.0, 1000.0, 5000.0):
        detector.observe(state, UsageSample(now, ()))
    assert detector.idle_seconds("/dev/nvidia0", 5000.0) == 0.0


def test_processes_active_on_a_card_whose_total_reads_zero_keep_it_busy() -> None:
    usage = ScriptedUsage.from_dict({"cards": [{"memoryMiB": 1000}], "usage": [
        {"at": 0, "card": 0, "utilization": 0, "processes": [{"pid": 1, "sm": 3}]}]}, lambda: 0.0)
    detector = IdleDetector({"/dev/nvidia0": 0}, idle_after=1.0)
    assert detector.observe(_usage(1, {0: (1, 0.0)}), usage.sample()) == {"/dev/nvidia0": BUSY}


@pytest.mark.parametrize("value, seconds", [
    pytest.param(90, 90.0, id="number"), pytest.param("1h30m", 5400.0, id="hours-minutes"),
    pytest.param("15m", 900.0, id="minutes"), pytest.param("2.5s", 2.5, id="fraction"),
])
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("data, message", [
    pytest.param({"cards": [{"memoryMiB": 1}], "usage": [{"at": "soon", "card": 0}]}, r"usage\[0\].*duration",
                 id="bad-time"),
    pytest.param({"cards": [{"memoryMiB": 1}], "usage": [{"at": 0, "card": 3}]}, "card 3", id="no-such-card"),
    pytest.param({"cards": [{"memoryMiB": 1}], "usage": [{"at": 0, "card": 0, "utilization": 140}]},
                 "percentage", id="utilisation-over-100"),
    pytest.param({"cards": [{}]}, "memoryMiB", id="card-without-memory"),
    pytest.param([], "cards", id="not-a-mapping"),
])
def test_a_bad_script_is_refused_with_the_entry_named(data: object, message: str) -> None:
    with pytest.raises(UsageScriptError, match=message):
        ScriptedUsage.from_dict(data, lambda: 0.0)


def test_the_idle_time_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        IdleDetector({}, idle_after=0)


def test_idle_changes_reach_the_state_file(tmp_path: Path) -> None:
    processes = FakeProcesses()
    processes.spawn(100, "/dev/nvidia0")
    file = StateFile(tmp_path / "state.json")
    recorder = UsageRecorder("n1", ["/dev/nvidia0"], file, processes, ignore_pids=())
    recorder.on_event(DeviceEvent(EventKind.OPEN, "/dev/nvidia0", 100, 0.0))
    detector = IdleDetector({"/dev/nvidia0": 0}, idle_after=TEN_MINUTES)
    clock = [0.0]
    usage = ScriptedUsage.from_dict({"cards": [{"memoryMiB": 1000}]}, lambda: clock[0])
    for now in (0.0, 300.0, 600.0):
        clock[0] = now
        for path, state in detector.observe(recorder.state, usage.sample()).items():
            recorder.set_state(path, state)
    loaded = file.load()
    assert loaded is not None and loaded.devices[0].state is IDLE
