"""Write-behind: the newest state is written, bursts cost one write, errors do not stop the writer."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpupool.nodeagent.monitor.state_file import StateFile
from gpupool.nodeagent.monitor.state_writer import BackgroundStateWriter
from gpupool.nodeagent.monitor.usage_state import UsageState


class SlowFile(StateFile):
    """A state file whose writes wait for :attr:`release` and are counted."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.release = threading.Event()
        self.started = threading.Event()
        self.written: list[float] = []
        self.fail_next = False

    def write(self, state: UsageState) -> None:
        self.started.set()
        self.release.wait(5)
        if self.fail_next:
            self.fail_next = False
            raise OSError(28, "No space left on device")
        super().write(state)
        self.written.append(state.updated)


def _state(updated: float) -> UsageState:
    return UsageState("n1", updated, ())


def test_a_burst_during_a_write_costs_one_more_write_of_the_newest_state(tmp_path: Path) -> None:
    file = SlowFile(tmp_path / "state.json")
    writer = BackgroundStateWriter(file)
    writer.start()
    try:
        writer.write(_state(0.0))
        assert file.started.wait(5)
        for updated in range(1, 101):
            writer.write(_state(float(updated)))
        file.release.set()
        assert writer.flush(5)
    finally:
        writer.stop()
    assert file.written == [0.0, 100.0]
    assert StateFile(tmp_path / "state.json").load() == _state(100.0)


def test_a_failed_write_is_logged_and_the_next_change_is_written(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    file = SlowFile(tmp_path / "state.json")
    file.release.set()
    file.fail_next = True
    writer = BackgroundStateWriter(file)
    writer.start()
    try:
        writer.write(_state(1.0))
        assert writer.flush(5)
        assert "No space left on device" in caplog.text
        writer.write(_state(2.0))
        assert writer.flush(5)
    finally:
        writer.stop()
    assert file.written == [2.0]


def test_stop_writes_what_is_queued(tmp_path: Path) -> None:
    file = SlowFile(tmp_path / "state.json")
    writer = BackgroundStateWriter(file)
    writer.start()
    writer.write(_state(1.0))
    assert file.started.wait(5)
    writer.write(_state(2.0))
    file.release.set()
    writer.stop()
    assert file.written == [1.0, 2.0]


def test_an_unsynced_file_is_still_replaced_whole(tmp_path: Path) -> None:
    file = StateFile(tmp_path / "state.json", sync=False)
    file.write(_state(1.0))
    file.write(_state(2.0))
    assert file.load() == _state(2.0)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
