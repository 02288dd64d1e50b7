"""fanotify source against the real kernel: real child processes open and close stand-in files.

Needs CAP_SYS_ADMIN and a kernel with fanotify permission events (CI runs as root); elsewhere these
tests skip with the probe's reason.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator

import pytest

from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind, Registration, SourceNotRegistered, Verdict
from gpupool.nodeagent.monitor.fanotify_source import FanotifySource
from gpupool.nodeagent.monitor.source_selector import probe_fanotify
from tests.nodeagent.monitor.children import CollectingSink, HoldingChild, open_in_child, stand_in


def _fanotify_unavailable() -> str | None:
    with tempfile.TemporaryDirectory() as directory:
        return probe_fanotify([stand_in(directory, "probe")])


_WHY_NOT = _fanotify_unavailable()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"fanotify not usable here: {_WHY_NOT}")


@pytest.fixture
def devices(tmp_path: os.PathLike[str]) -> list[str]:
    return [stand_in(str(tmp_path), f"nvidia{i}") for i in range(2)]


@pytest.fixture
def sink() -> CollectingSink:
    return CollectingSink()


@pytest.fixture
def source(devices: list[str], sink: CollectingSink) -> Iterator[FanotifySource]:
    src = FanotifySource(devices)
    src.register(Registration(sink))
    src.start()
    yield src
    src.stop()


@pytest.mark.slow
def test_a_childs_open_and_close_are_reported_with_its_pid(source: FanotifySource, devices: list[str],
                                                          sink: CollectingSink) -> None:
    with HoldingChild(devices[1]) as child:
        opened = sink.wait_for(EventKind.OPEN, devices[1], child.pid)
        child.close_files()
        closed = sink.wait_for(EventKind.CLOSE, devices[1], child.pid)
    assert opened.time <= closed.time
    assert all(e.path == devices[1] for e in sink.drain())


@pytest.mark.slow
def test_a_denied_open_fails_with_eperm_and_is_not_recorded(devices: list[str], sink: CollectingSink) -> None:
    asked: list[DeviceEvent] = []

    def deny_nvidia0(event: DeviceEvent) -> Verdict:
        asked.append(event)
        return Verdict.DENY if event.path == devices[0] else Verdict.ALLOW

    src = FanotifySource(devices)
    src.register(Registration(sink, deny_nvidia0))
    src.start()
    try:
        assert open_in_child(devices[0]) == errno.EPERM
        assert open_in_child(devices[1]) == 0
    finally:
        src.stop()
    assert [e.path for e in asked] == devices
    assert [e.kind for e in asked] == [EventKind.OPEN, EventKind.OPEN]
    assert not [e for e in sink.drain() if e.path == devices[0]]


def test_a_failing_decider_lets_the_open_through(devices: list[str], sink: CollectingSink) -> None:
    def broken(event: DeviceEvent) -> Verdict:
        raise RuntimeError("bug in the lending rules")

    src = FanotifySource(devices)
    src.register(Registration(sink, broken))
    src.start()
    try:
        assert open_in_child(devices[0]) == 0
    finally:
        src.stop()


@pytest.mark.slow
def test_the_switch_turns_reporting_off_and_on(source: FanotifySource, devices: list[str],
                                              sink: CollectingSink) -> None:
    source.set_watching(False)
    assert source.marked == ()
    with HoldingChild(devices[0]) as quiet:
        quiet.close_files()
    assert not [e for e in sink.drain() if e.pid == quiet.process.pid]
    source.set_watching(True)
    with HoldingChild(devices[0]) as loud:
        sink.wait_for(EventKind.OPEN, devices[0], loud.pid)


def test_files_that_are_not_watched_are_not_reported(source: FanotifySource, tmp_path: os.PathLike[str],
                                                     sink: CollectingSink) -> None:
    other = stand_in(str(tmp_path), "not-a-gpu")
    with HoldingChild(other) as child:
        child.close_files()
    assert not [e for e in sink.drain() if e.pid == child.pid]


def test_the_agents_own_opens_are_allowed_and_not_recorded(source: FanotifySource, devices: list[str],
                                                           sink: CollectingSink) -> None:
    # Would deadlock if the source tried to ask about its own process's open.
    with open(devices[0], encoding="utf-8") as fh:
        assert fh.read()
    assert not [e for e in sink.drain() if e.pid == os.getpid()]


def test_a_source_does_not_start_before_a_recorder_registers(devices: list[str]) -> None:
    with pytest.raises(SourceNotRegistered, match="must register"):
        FanotifySource(devices).start()


def test_a_missing_device_file_is_not_marked_and_the_others_are(devices: list[str], sink: CollectingSink,
                                                                tmp_path: os.PathLike[str]) -> None:
    gone = os.path.join(str(tmp_path), "nvidia7")
    src = FanotifySource([*devices, gone])
    src.register(Registration(sink))
    src.start()
    try:
        assert src.marked == tuple(devices)
        with HoldingChild(devices[0]) as child:
            sink.wait_for(EventKind.OPEN, devices[0], child.pid)
    finally:
        src.stop()
