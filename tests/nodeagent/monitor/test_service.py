"""The monitor as the agent runs it: start-up order, busy/idle changes told to listeners, and bad
input (a failing sampler, a source that cannot start, a corrupt state file) that never stops it and
never makes a held card free or idle."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind
from gpupool.nodeagent.monitor.service import MonitorConfig, StateChange, UsageMonitor
from gpupool.nodeagent.monitor.source_selector import SourceChoice
from gpupool.nodeagent.monitor.usage_sampling import CardUsage, UsageSample
from gpupool.nodeagent.monitor.usage_state import DeviceState, ProcessIdentity
from tests.nodeagent.monitor.fake_processes import FakeProcesses
from tests.nodeagent.monitor.scripted_source import ScriptedSource

GPU0, GPU1, CTL = "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"
IDLE_AFTER = 600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Sampler:
    """Card 0's utilisation as the test sets it; ``error`` makes a sample raise."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.utilization = 0
        self.error: Exception | None = None

    def sample(self) -> UsageSample:
        if self.error is not None:
            raise self.error
        return UsageSample(self.clock(), (CardUsage(0, self.utilization, 100, 16384),
                                          CardUsage(1, 0, 0, 16384)))


class World:
    def __init__(self, tmp_path: Path, source: ScriptedSource | None = None,
                 ignore_pids: Iterable[int] | None = ()) -> None:
        self.clock = Clock()
        self.sampler = Sampler(self.clock)
        self.processes = FakeProcesses()
        self.source = source or ScriptedSource()
        self.changes: list[StateChange] = []
        self.state_path = tmp_path / "state.json"

        def choose(paths: Sequence[str]) -> SourceChoice:
            assert list(paths) == [GPU0, GPU1, CTL]
            return SourceChoice(self.source, "scripted for the test")

        async def listen(change: StateChange) -> None:
            self.changes.append(change)

        self.monitor = UsageMonitor(
            "n1", {GPU0: 0, GPU1: 1}, (CTL,), self.sampler, MonitorConfig(str(self.state_path), IDLE_AFTER),
            choose=choose, processes=self.processes, clock=self.clock, on_change=listen,
            identify=lambda pid: ProcessIdentity(f"c{pid}", "train", "job-0", "ml"),
            ignore_pids=ignore_pids)  # (): a scripted pid may be this process's own

    def open(self, pid: int, path: str = GPU0) -> None:
        self.processes.spawn(pid, path)
        self.source.emit(DeviceEvent(EventKind.OPEN, path, pid, self.clock()))

    async def at(self, now: float) -> list[StateChange]:
        self.clock.now = now
        changes = await self.monitor.step()
        await asyncio.sleep(0)  # let the listener tasks run
        return changes


def test_the_recorder_registers_before_the_source_starts(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.monitor.start()
    world.monitor.stop()
    assert world.source.calls == ["register", "start", "stop"]


def test_the_agents_own_opens_are_not_recorded_unless_the_monitor_is_told_otherwise(tmp_path: Path) -> None:
    """By default the agent's own pid is ignored (its NVML calls open the cards). A test scripting
    opens by made-up pids passes ``ignore_pids=()``: before, the monitor had no such setting and a
    scripted pid that happened to be the test process's own (pids wrap to 300 after pid_max) was
    silently not recorded (issue 24: test_dra_usage's pid 400 used nothing)."""
    for name, ignore, recorded in (("default", None, []), ("scripted", (), [os.getpid()])):
        (tmp_path / name).mkdir()
        world = World(tmp_path / name, ignore_pids=ignore)
        world.monitor.start()
        world.open(os.getpid())
        world.monitor.stop()
        assert [h.pid for h in world.monitor.state.device(GPU0).holders] == recorded, name  # type: ignore[union-attr]


def test_busy_and_idle_changes_reach_the_listener_with_the_holding_pod(tmp_path: Path) -> None:
    asyncio.run(_busy_and_idle_changes_reach_the_listener_with_the_holding_pod(tmp_path))


async def _busy_and_idle_changes_reach_the_listener_with_the_holding_pod(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.monitor.start()
    world.open(4242)
    world.sampler.utilization = 50
    assert await world.at(1001.0) == []  # busy from the open on: no change to report
    world.sampler.utilization = 0
    assert await world.at(1001.0 + IDLE_AFTER - 1) == []
    [idle] = await world.at(1001.0 + IDLE_AFTER)
    assert (idle.card, idle.previous, idle.current) == (0, DeviceState.BUSY, DeviceState.IDLE)
    assert [(h.pid, h.namespace, h.pod, h.container) for h in idle.holders] == [(4242, "ml", "job-0", "train")]
    assert world.monitor.state.device(GPU0).state is DeviceState.IDLE  # type: ignore[union-attr]
    assert world.monitor.idle_seconds(GPU0) == pytest.approx(IDLE_AFTER)
    world.sampler.utilization = 30
    [busy] = await world.at(2000.0)
    assert (busy.previous, busy.current) == (DeviceState.IDLE, DeviceState.BUSY)
    assert world.changes == [idle, busy]
    assert world.monitor.transitions == {(0, DeviceState.IDLE): 1, (0, DeviceState.BUSY): 1}
    world.monitor.stop()


def test_a_failing_sampler_keeps_a_held_card_busy_and_the_monitor_running(tmp_path: Path) -> None:
    asyncio.run(_a_failing_sampler_keeps_a_held_card_busy_and_the_monitor_running(tmp_path))


async def _a_failing_sampler_keeps_a_held_card_busy_and_the_monitor_running(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.monitor.start()
    world.open(4242)
    world.sampler.error = RuntimeError("NVML_ERROR_GPU_IS_LOST")
    for now in (1001.0, 1000.0 + 10 * IDLE_AFTER):
        assert await world.at(now) == []
    assert world.monitor.state.device(GPU0).state is DeviceState.BUSY  # type: ignore[union-attr]
    assert world.monitor.sample_errors == 2
    world.monitor.stop()


def test_a_listener_that_fails_does_not_stop_the_monitor(tmp_path: Path) -> None:
    asyncio.run(_a_listener_that_fails_does_not_stop_the_monitor(tmp_path))


async def _a_listener_that_fails_does_not_stop_the_monitor(tmp_path: Path) -> None:
    world = World(tmp_path)

    async def broken(change: StateChange) -> None:
        raise ConnectionError("apiserver away")

    world.monitor._on_change = broken
    world.monitor.start()
    world.open(4242)
    await world.at(1001.0)
    assert len(await world.at(1001.0 + IDLE_AFTER)) == 1
    await asyncio.sleep(0.01)
    assert world.monitor.state.device(GPU0).state is DeviceState.IDLE  # type: ignore[union-attr]
    world.monitor.stop()


def test_a_source_that_cannot_start_falls_back_to_the_proc_scan(tmp_path: Path) -> None:
    world = World(tmp_path, ScriptedSource(fail_start=True))
    world.monitor.start()
    try:
        assert world.monitor.source is not None and world.monitor.source.name == "proc-scan"
        assert "scripted failed to start: no such mechanism" in world.monitor.source_reason
    finally:
        world.monitor.stop()


def test_a_corrupt_state_file_is_set_aside_and_the_monitor_starts(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.state_path.write_text('{"schema": "gpupool.io/usage-state", "vers')
    world.monitor.start()
    world.open(7)
    world.monitor.stop()
    assert (tmp_path / "state.json.corrupt").exists()
    assert world.monitor.state.device(GPU0).holders[0].pid == 7  # type: ignore[union-attr]


def test_the_run_loop_survives_a_step_that_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    asyncio.run(_the_run_loop_survives_a_step_that_raises(tmp_path, caplog))


async def _the_run_loop_survives_a_step_that_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    world = World(tmp_path)
    world.monitor.config = MonitorConfig(str(world.state_path), IDLE_AFTER, sample_every=0.001)
    steps = []

    async def flaky() -> list[StateChange]:
        steps.append(1)
        raise ValueError("a bug")

    world.monitor.step = flaky  # type: ignore[method-assign]
    task = asyncio.create_task(world.monitor.run())
    while len(steps) < 3:
        await asyncio.sleep(0.005)
    assert not task.done()
    task.cancel()
    assert "usage monitor step failed" in caplog.text
