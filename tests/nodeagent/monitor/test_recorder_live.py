"""Source → recorder → state file with real child processes and the real /proc."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.nodeagent.linux.watched_files import WatchedFiles
from gpupool.nodeagent.monitor.events import EventSource
from gpupool.nodeagent.monitor.fanotify_source import FanotifySource
from gpupool.nodeagent.monitor.proc_scan_source import ProcScanSource
from gpupool.nodeagent.monitor.process_table import ProcfsTable
from gpupool.nodeagent.monitor.recorder import UsageRecorder
from gpupool.nodeagent.monitor.source_selector import probe_fanotify
from gpupool.nodeagent.monitor.state_codec import decode_state
from gpupool.nodeagent.monitor.state_file import StateFile
from gpupool.nodeagent.monitor.state_writer import BackgroundStateWriter
from gpupool.nodeagent.monitor.usage_state import DeviceState
from tests.nodeagent.monitor.children import WAIT_SECONDS, HoldingChild, stand_in


def _holders_on_disk(path: Path) -> dict[str, tuple[DeviceState, list[int]]]:
    try:
        state = decode_state(path.read_bytes())
    except FileNotFoundError:
        return {}
    return {d.path: (d.state, [h.pid for h in d.holders]) for d in state.devices}


def _wait_on_disk(path: Path, device: str, expected: tuple[DeviceState, list[int]]) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if _holders_on_disk(path).get(device) == expected:
            return
        time.sleep(0.01)
    raise AssertionError(f"{device}: wanted {expected}, the file says {_holders_on_disk(path).get(device)}")


def _fanotify(paths: list[str]) -> EventSource:
    why_not = probe_fanotify(paths)
    if why_not is not None:
        pytest.skip(f"fanotify not usable here: {why_not}")
    return FanotifySource(paths)


def _scan(paths: list[str]) -> EventSource:
    return ProcScanSource(paths, interval=0.05)


@pytest.mark.parametrize("make_source", [pytest.param(_fanotify, id="fanotify"),
                                         pytest.param(_scan, id="proc-scan")])
def test_a_childs_hold_shows_in_the_state_file_until_it_exits(
        tmp_path: Path, make_source: Callable[[list[str]], EventSource]) -> None:
    devices = [stand_in(str(tmp_path), f"nvidia{i}") for i in range(2)]
    state_path = tmp_path / "state" / "state.json"
    writer = BackgroundStateWriter(StateFile(state_path))  # as the agent runs it
    writer.start()
    recorder = UsageRecorder("n1", devices, writer, ProcfsTable(WatchedFiles(devices)))
    recorder.restore()
    source = make_source(devices)
    source.register(recorder.registration())
    source.start()
    try:
        child = HoldingChild(devices[1])
        _wait_on_disk(state_path, devices[1], (DeviceState.BUSY, [child.pid]))
        child.process.kill()
        child.process.wait()
        _wait_on_disk(state_path, devices[1], (DeviceState.FREE, []))
    finally:
        source.stop()
        writer.stop()
    assert _holders_on_disk(state_path)[devices[0]] == (DeviceState.FREE, [])


def test_a_restart_drops_a_holder_that_died_meanwhile_and_keeps_a_live_one(tmp_path: Path) -> None:
    devices = [stand_in(str(tmp_path), f"nvidia{i}") for i in range(2)]
    state_path = tmp_path / "state.json"
    table = ProcfsTable(WatchedFiles(devices))
    with HoldingChild(devices[0]) as survivor, HoldingChild(devices[1]) as casualty:
        first = UsageRecorder("n1", devices, StateFile(state_path), table)
        first.restore()  # finds both by scanning
        assert _holders_on_disk(state_path) == {devices[0]: (DeviceState.BUSY, [survivor.pid]),
                                                devices[1]: (DeviceState.BUSY, [casualty.pid])}
        casualty.process.kill()
        casualty.process.wait()
        UsageRecorder("n1", devices, StateFile(state_path), table).restore()
        assert _holders_on_disk(state_path) == {devices[0]: (DeviceState.BUSY, [survivor.pid]),
                                                devices[1]: (DeviceState.FREE, [])}
    assert os.getpid() not in _holders_on_disk(state_path)[devices[0]][1]
