"""The /proc scan source with real child processes holding stand-in files (and a real char device)."""

from __future__ import annotations

import os

import pytest

from gpupool.nodeagent.monitor.events import EventKind, Registration, SourceNotRegistered
from gpupool.nodeagent.monitor.proc_scan_source import ProcScanSource
from tests.nodeagent.monitor.children import CollectingSink, HoldingChild, stand_in


@pytest.fixture
def devices(tmp_path: os.PathLike[str]) -> list[str]:
    return [stand_in(str(tmp_path), f"nvidia{i}") for i in range(2)]


def _source(paths: list[str], sink: CollectingSink) -> ProcScanSource:
    source = ProcScanSource(paths, interval=0.05)
    source.register(Registration(sink))
    return source


def test_holding_and_releasing_are_found_by_diffing_scans(devices: list[str]) -> None:
    sink = CollectingSink()
    source = _source(devices, sink)
    with HoldingChild(devices[1]) as child:
        source.scan_once()
        assert [(e.kind, e.path) for e in sink.drain(0) if e.pid == child.pid] == [(EventKind.OPEN, devices[1])]
        source.scan_once()
        assert len(sink.drain(0)) == 1, "an unchanged holding is reported once"
        child.close_files()
        source.scan_once()
    assert [(e.kind, e.path) for e in sink.drain(0) if e.pid == child.pid] == [
        (EventKind.OPEN, devices[1]), (EventKind.CLOSE, devices[1])]


def test_the_scanning_thread_reports_a_child_that_exits_holding_the_file(devices: list[str]) -> None:
    sink = CollectingSink()
    source = _source(devices, sink)
    source.start()
    try:
        child = HoldingChild(*devices)
        for path in devices:
            sink.wait_for(EventKind.OPEN, path, child.pid)
        child.process.kill()
        child.process.wait()
        for path in devices:
            sink.wait_for(EventKind.CLOSE, path, child.pid)
    finally:
        source.stop()


def test_a_character_device_is_matched_by_its_device_number(tmp_path: os.PathLike[str]) -> None:
    """fanotify reports nothing for character devices on recent kernels; the scan must see them,
    also through another node of the same device (as in a container's own /dev)."""
    sink = CollectingSink()
    source = _source(["/dev/null"], sink)
    other_node = os.path.join(str(tmp_path), "null")
    try:
        os.mknod(other_node, 0o666 | 0o020000, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")
    with HoldingChild(other_node) as child:
        source.scan_once()
    assert [(e.kind, e.path) for e in sink.drain(0) if e.pid == child.pid] == [(EventKind.OPEN, "/dev/null")]


def test_the_switch_off_pauses_reporting(devices: list[str]) -> None:
    sink = CollectingSink()
    source = _source(devices, sink)
    source.set_watching(False)
    source.start()
    try:
        with HoldingChild(devices[0]) as child:
            assert not [e for e in sink.drain(0.3) if e.pid == child.pid]
            source.set_watching(True)
            sink.wait_for(EventKind.OPEN, devices[0], child.pid)
    finally:
        source.stop()


def test_the_scan_does_not_start_before_a_recorder_registers(devices: list[str]) -> None:
    with pytest.raises(SourceNotRegistered):
        ProcScanSource(devices).start()
    assert not ProcScanSource(devices).can_decide


def test_a_device_file_that_appears_later_is_picked_up(tmp_path: os.PathLike[str]) -> None:
    late = os.path.join(str(tmp_path), "nvidia3")
    sink = CollectingSink()
    source = _source([late], sink)
    source.scan_once()
    stand_in(str(tmp_path), "nvidia3")
    with HoldingChild(late) as child:
        source.scan_once()
    assert [e.kind for e in sink.drain(0) if e.pid == child.pid] == [EventKind.OPEN]
