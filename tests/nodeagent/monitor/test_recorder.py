"""The recorder's rules: holders from events, kept honest against the process table, persisted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool.nodeagent.monitor.events import DeviceEvent, EventKind
from gpupool.nodeagent.monitor.recorder import UsageRecorder
from gpupool.nodeagent.monitor.state_codec import decode_state
from gpupool.nodeagent.monitor.state_file import StateFile
from gpupool.nodeagent.monitor.usage_state import DeviceState, ProcessIdentity
from tests.nodeagent.monitor.fake_processes import FakeProcesses

GPU0, GPU1 = "/dev/nvidia0", "/dev/nvidia1"


def _recorder(tmp_path: Path, processes: FakeProcesses) -> UsageRecorder:
    def identify(pid: int) -> ProcessIdentity:
        return ProcessIdentity(f"c{pid}", "main", f"pod-{pid}", "ml")

    return UsageRecorder("n1", [GPU0, GPU1], StateFile(tmp_path / "state.json"), processes,
                         identify=identify, clock=lambda: 50.0, ignore_pids=())


def _on_disk(tmp_path: Path) -> dict[str, object]:
    state = decode_state((tmp_path / "state.json").read_bytes())
    return {d.path: (d.state, [h.pid for h in d.holders], d.last_use) for d in state.devices}


def open_(pid: int, path: str = GPU0, at: float = 10.0) -> DeviceEvent:
    return DeviceEvent(EventKind.OPEN, path, pid, at)


def close(pid: int, path: str = GPU0, at: float = 20.0) -> DeviceEvent:
    return DeviceEvent(EventKind.CLOSE, path, pid, at)


def test_an_open_records_the_holder_with_its_pod_and_the_file_says_so(tmp_path: Path) -> None:
    procs = FakeProcesses()
    procs.spawn(7, GPU0, start=123)
    recorder = _recorder(tmp_path, procs)
    recorder.on_event(open_(7))
    assert _on_disk(tmp_path) == {GPU0: (DeviceState.BUSY, [7], 10.0), GPU1: (DeviceState.FREE, [], None)}
    holder = recorder.state.devices[0].holders[0]
    assert (holder.start_time, holder.since, holder.pod, holder.namespace, holder.container_id) == (
        123, 10.0, "pod-7", "ml", "c7")
    assert holder.priority is None


def test_a_close_frees_the_device_and_keeps_the_last_use(tmp_path: Path) -> None:
    procs = FakeProcesses()
    procs.spawn(7, GPU0)
    recorder = _recorder(tmp_path, procs)
    recorder.on_event(open_(7))
    procs.close(7, GPU0)
    recorder.on_event(close(7))
    assert _on_disk(tmp_path)[GPU0] == (DeviceState.FREE, [], 20.0)


def test_a_close_while_the_process_still_holds_another_descriptor_keeps_it(tmp_path: Path) -> None:
    procs = FakeProcesses()
    procs.spawn(7, GPU0)
    recorder = _recorder(tmp_path, procs)
    recorder.on_event(open_(7))
    recorder.on_event(close(7))
    assert _on_disk(tmp_path)[GPU0][:2] == (DeviceState.BUSY, [7])


def test_a_close_reported_for_a_forked_child_also_drops_the_parent_that_let_go(tmp_path: Path) -> None:
    """The kernel reports the close for the process dropping the last reference, not the opener."""
    procs = FakeProcesses()
    procs.spawn(7, GPU0)
    recorder = _recorder(tmp_path, procs)
    recorder.on_event(open_(7))
    procs.close(7, GPU0)  # the parent closed; its forked child 8 held the file until now
    recorder.on_event(close(8))
    assert _on_disk(tmp_path)[GPU0][:2] == (DeviceState.FREE, [])


def test_an_open_by_a_process_that_already_exited_records_no_holder(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path, FakeProcesses())
    recorder.on_event(open_(9))
    assert _on_disk(tmp_path)[GPU0] == (DeviceState.FREE, [], 10.0)


def test_events_for_unwatched_files_and_ignored_pids_change_nothing(tmp_path: Path) -> None:
    procs = FakeProcesses()
    procs.spawn(7, "/dev/other")
    recorder = UsageRecorder("n1", [GPU0], StateFile(tmp_path / "state.json"), procs, ignore_pids=[8])
    recorder.on_event(open_(7, "/dev/other"))
    procs.spawn(8, GPU0)
    recorder.on_event(open_(8))
    assert not (tmp_path / "state.json").exists()


def test_prune_drops_exited_holders_only(tmp_path: Path) -> None:
    procs = FakeProcesses()
    procs.spawn(7, GPU0)
    procs.spawn(8, GPU0)
    recorder = _recorder(tmp_path, procs)
    recorder.on_event(open_(7))
    recorder.on_event(open_(8))
    procs.exit(7)
    recorder.prune()
    assert _on_disk(tmp_path)[GPU0][:2] == (DeviceState.BUSY, [8])


def test_prune_counts_and_logs_the_holders_it_releases(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    procs = FakeProcesses()
    for pid in (7, 8, 9):
        procs.spawn(pid, GPU0)
    recorder = _recorder(tmp_path, procs)
    for pid in (7, 8, 9):
        recorder.on_event(open_(pid))
    procs.exit(7)
    procs.exit(9)
    with caplog.at_level("INFO", logger="gpupool.nodeagent.monitor.recorder"):
        assert recorder.prune() == 2
    assert recorder.prune() == 0  # nothing more to release: counted once
    assert recorder.released == 2
    released = [r.getMessage() for r in caplog.records if r.getMessage().startswith("released")]
    assert [m.split(": pid ")[1].split(" ")[0] for m in released] == ["7", "9"]


@pytest.mark.parametrize("change, survivors", [
    pytest.param(lambda p: None, [7, 8], id="both-alive"),
    pytest.param(lambda p: p.exit(7), [8], id="holder-exited"),
    pytest.param(lambda p: p.spawn(7, start=999), [8], id="pid-reused-by-another-process"),
    pytest.param(lambda p: p.close(8, GPU0), [7], id="closed-while-the-agent-was-down"),
])
def test_a_restart_keeps_the_holders_that_are_still_there(tmp_path: Path, change: object,
                                                          survivors: list[int]) -> None:
    procs = FakeProcesses()
    procs.spawn(7, GPU0)
    procs.spawn(8, GPU0)
    first = _recorder(tmp_path, procs)
    first.on_event(open_(7))
    first.on_event(open_(8))
    first.set_state(GPU0, DeviceState.IDLE)
    change(procs)  # type: ignore[operator]
    second = _recorder(tmp_path, procs)
    second.restore()
    assert _on_disk(tmp_path)[GPU0] == (DeviceState.IDLE, survivors, 10.0)
    assert [h.since for h in second.state.devices[0].holders] == [10.0] * len(survivors)


def test_a_reused_pid_that_holds_the_device_is_a_new_holder(tmp_path: Path) -> None:
    procs = FakeProcesses()
    procs.spawn(7, GPU0, start=100)
    _recorder(tmp_path, procs).on_event(open_(7))
    procs.spawn(7, GPU0, start=999)
    second = _recorder(tmp_path, procs)
    second.restore()
    holder = second.state.devices[0].holders[0]
    assert (holder.pid, holder.start_time, holder.since) == (7, 999, 50.0)


def test_a_restart_adds_processes_that_opened_while_the_agent_was_down(tmp_path: Path) -> None:
    procs = FakeProcesses()
    _recorder(tmp_path, procs).restore()
    procs.spawn(11, GPU1)
    second = _recorder(tmp_path, procs)
    second.restore()
    assert _on_disk(tmp_path)[GPU1] == (DeviceState.BUSY, [11], None)
    assert second.state.devices[1].holders[0].pod == "pod-11"


def test_a_restart_after_every_holder_left_marks_the_device_free(tmp_path: Path) -> None:
    procs = FakeProcesses()
    procs.spawn(7, GPU0)
    first = _recorder(tmp_path, procs)
    first.on_event(open_(7))
    first.set_state(GPU0, DeviceState.IDLE)
    procs.exit(7)
    _recorder(tmp_path, procs).restore()
    assert _on_disk(tmp_path)[GPU0] == (DeviceState.FREE, [], 10.0)


def test_a_corrupt_file_is_moved_aside_and_the_agent_starts_fresh(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "state.json").write_text('{"schema": "gpupool.io/usage-state", "version": 1, "dev')
    procs = FakeProcesses()
    procs.spawn(7, GPU0)
    recorder = _recorder(tmp_path, procs)
    recorder.restore()
    assert "unreadable" in caplog.text and "not JSON" in caplog.text
    assert (tmp_path / "state.json.corrupt").exists()
    assert _on_disk(tmp_path)[GPU0][:2] == (DeviceState.BUSY, [7])


def test_the_idle_rule_cannot_mark_a_device_nobody_holds(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path, FakeProcesses())
    recorder.set_state(GPU0, DeviceState.IDLE)
    assert recorder.state.devices[0].state is DeviceState.FREE


def test_a_write_failure_is_logged_and_the_state_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    procs = FakeProcesses()
    procs.spawn(7, GPU0)
    recorder = UsageRecorder("n1", [GPU0], StateFile(blocker / "state.json"), procs, ignore_pids=())
    recorder.on_event(open_(7))
    assert "cannot write the usage state file" in caplog.text
    assert [h.pid for h in recorder.state.devices[0].holders] == [7]


def test_the_file_is_json_with_a_schema_and_version(tmp_path: Path) -> None:
    _recorder(tmp_path, FakeProcesses()).restore()
    document = json.loads((tmp_path / "state.json").read_text())
    assert (document["schema"], document["version"], document["node"]) == ("gpupool.io/usage-state", 1, "n1")


def test_a_holder_opened_before_its_pod_named_the_container_is_named_later(tmp_path: Path) -> None:
    """A real container opens its device at once; kubelet reports its ID in the pod status later."""
    known: dict[int, ProcessIdentity] = {}
    procs = FakeProcesses()
    procs.spawn(7, GPU0, start=123)
    procs.spawn(8, GPU0, start=124)
    recorder = UsageRecorder("n1", [GPU0], StateFile(tmp_path / "state.json"), procs,
                             identify=lambda pid: known.get(pid, ProcessIdentity(f"c{pid}")), ignore_pids=())
    recorder.on_event(open_(7))
    recorder.on_event(open_(8))
    known[7] = ProcessIdentity("c7", "train", "job", "ml")
    recorder.identify_again()
    names = {h.pid: (h.container_id, h.container, h.pod, h.namespace, h.since)
             for h in decode_state((tmp_path / "state.json").read_bytes()).devices[0].holders}
    assert names == {7: ("c7", "train", "job", "ml", 10.0), 8: ("c8", "", "", "", 10.0)}


def test_a_reused_pid_is_not_named_after_the_new_process(tmp_path: Path) -> None:
    known: dict[int, ProcessIdentity] = {}
    procs = FakeProcesses()
    procs.spawn(7, GPU0, start=123)
    recorder = UsageRecorder("n1", [GPU0], StateFile(tmp_path / "state.json"), procs,
                             identify=lambda pid: known.get(pid, ProcessIdentity()), ignore_pids=())
    recorder.on_event(open_(7))
    procs.exit(7)
    procs.spawn(7, GPU0, start=999)  # another process got pid 7 before the holder was named
    known[7] = ProcessIdentity("c9", "other", "other-pod", "ml")
    recorder.identify_again()
    [holder] = recorder.state.devices[0].holders
    assert (holder.start_time, holder.container) == (123, "")
