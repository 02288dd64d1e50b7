"""The /proc scan source with real child processes holding stand-in files (and a real char device)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpupool.nodeagent.monitor.events import EventKind, Registration, SourceNotRegistered
from gpupool.nodeagent.monitor.proc_scan_source import ProcScanSource
from tests.nodeagent.monitor.children import CollectingSink, HoldingChild, LateOpener, stand_in


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


@pytest.mark.slow
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


def _lean_source(paths: list[str], sink: CollectingSink, every: int, proc: str = "/proc") -> ProcScanSource:
    """A source past every process's start-up window that lists each fd table once in ``every`` scans."""
    source = ProcScanSource(paths, interval=0.05, full_list_every=every, young_scans=0, proc=proc)
    source.register(Registration(sink))
    return source


def _events_of(sink: CollectingSink, pid: int) -> list[tuple[EventKind, str]]:
    return [(e.kind, e.path) for e in sink.drain(0) if e.pid == pid]


def test_an_old_process_that_opens_later_is_found_at_its_full_listing(devices: list[str]) -> None:
    every = 3
    sink = CollectingSink()
    source = _lean_source(devices, sink, every)
    with LateOpener(devices[0]) as child:
        source.scan_once()  # scan 0: first sight, listed, holds nothing
        child.open_files()
        for scan in range(1, every + 1):
            source.scan_once()
            due = (child.pid + scan) % every == 0
            assert _events_of(sink, child.pid) == ([(EventKind.OPEN, devices[0])] if due else []), scan
            if due:
                break


def test_a_holders_close_and_exit_are_found_every_scan_between_full_listings(devices: list[str]) -> None:
    sink = CollectingSink()
    source = _lean_source(devices, sink, every=10**6)
    with HoldingChild(devices[0]) as closer, HoldingChild(devices[1]) as quitter:
        source.scan_once()
        source.scan_once()
        closer.close_files()
        quitter.process.kill()
        quitter.process.wait()
        source.scan_once()
    assert _events_of(sink, closer.pid) == [(EventKind.OPEN, devices[0]), (EventKind.CLOSE, devices[0])]
    assert _events_of(sink, quitter.pid) == [(EventKind.OPEN, devices[1]), (EventKind.CLOSE, devices[1])]


def _fake_process(proc: Path, pid: int, start: int, holds: str) -> None:
    """``proc/<pid>/stat`` with start time ``start`` and ``proc/<pid>/fd/3`` linking to ``holds``."""
    (proc / str(pid) / "fd").mkdir(parents=True, exist_ok=True)
    fields = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 30  # field 22 is the start time
    (proc / str(pid) / "stat").write_text(f"{pid} (a b) {' '.join(fields)}\n")
    link = proc / str(pid) / "fd" / "3"
    link.unlink(missing_ok=True)
    link.symlink_to(holds)


def test_a_reused_pid_of_a_holder_is_a_close_and_an_open_between_full_listings(tmp_path: Path) -> None:
    """The new process holds the same file through the same descriptor number: only the start time
    tells the two processes apart."""
    device = stand_in(str(tmp_path), "nvidia0")
    proc = tmp_path / "proc"
    _fake_process(proc, 4242, start=100, holds=device)
    sink = CollectingSink()
    source = _lean_source([device], sink, every=10**6, proc=str(proc))
    source.scan_once()
    source.scan_once()
    assert [(e.kind, e.pid) for e in sink.drain(0)] == [(EventKind.OPEN, 4242)]
    _fake_process(proc, 4242, start=200, holds=device)
    source.scan_once()
    assert [(e.kind, e.pid) for e in sink.drain(0)] == [(EventKind.OPEN, 4242), (EventKind.CLOSE, 4242),
                                                        (EventKind.OPEN, 4242)]


@pytest.mark.parametrize(("every", "young"), [pytest.param(0, 0, id="every-0"), pytest.param(1, -1, id="young-neg")])
def test_bad_scan_settings_are_refused(devices: list[str], every: int, young: int) -> None:
    with pytest.raises(ValueError, match="full_list_every"):
        ProcScanSource(devices, full_list_every=every, young_scans=young)


def test_a_path_held_through_two_descriptors_stays_held_when_one_closes(tmp_path: Path) -> None:
    device = stand_in(str(tmp_path), "nvidia0")
    proc = tmp_path / "proc"
    _fake_process(proc, 7, start=1, holds=device)
    (proc / "7" / "fd" / "4").symlink_to(device)
    sink = CollectingSink()
    source = _lean_source([device], sink, every=10**6, proc=str(proc))
    source.scan_once()
    (proc / "7" / "fd" / "3").unlink()
    source.scan_once()
    assert [(e.kind, e.pid) for e in sink.drain(0)] == [(EventKind.OPEN, 7)]
    (proc / "7" / "fd" / "4").unlink()
    source.scan_once()
    assert [(e.kind, e.pid) for e in sink.drain(0)] == [(EventKind.OPEN, 7), (EventKind.CLOSE, 7)]
