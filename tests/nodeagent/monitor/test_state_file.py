"""State file codec (round trip, strict reader) and the file's behaviour on torn and corrupt content."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.nodeagent.linux.fs_kind import filesystem_magic, in_memory
from gpupool.nodeagent.monitor.state_codec import StateFileError, decode_state, encode_state
from gpupool.nodeagent.monitor.state_file import StateFile
from gpupool.nodeagent.monitor.usage_state import DeviceState, DeviceUsage, Holder, UsageState

_times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
_text = st.text(max_size=20)


@st.composite
def _devices(draw: st.DrawFn, path: str) -> DeviceUsage:
    pids = draw(st.lists(st.integers(1, 2**22), unique=True, max_size=4))
    holders = tuple(Holder(pid=p, start_time=draw(st.integers(0, 2**40)), since=draw(_times),
                           container_id=draw(_text), container=draw(_text), pod=draw(_text),
                           namespace=draw(_text), priority=draw(st.none() | st.integers(-1000, 1000)))
                    for p in sorted(pids))
    state = DeviceState.FREE if not holders else draw(st.sampled_from([DeviceState.BUSY, DeviceState.IDLE]))
    return DeviceUsage(path, holders, draw(st.none() | _times), state)


@st.composite
def _states(draw: st.DrawFn) -> UsageState:
    count = draw(st.integers(0, 4))
    devices = tuple(draw(_devices(f"/dev/nvidia{i}")) for i in range(count))
    return UsageState(draw(_text), draw(_times), devices)


@pytest.mark.slow
@given(_states())
def test_every_state_reads_back_as_written(state: UsageState) -> None:
    assert decode_state(encode_state(state)) == state


@pytest.mark.slow
@settings(max_examples=60)
@given(_states(), st.data())
def test_a_torn_write_is_refused_never_misread(state: UsageState, data: st.DataObject) -> None:
    content = encode_state(state)
    cut = data.draw(st.integers(0, len(content) - 1))
    with pytest.raises(StateFileError):
        decode_state(content[:cut])


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3),
                     max_leaves=12)


@given(_json)
def test_any_json_either_decodes_or_is_refused_with_a_reason(value: object) -> None:
    content = json.dumps(value).encode()
    try:
        decode_state(content)
    except StateFileError as exc:
        assert str(exc)


@pytest.mark.parametrize("mutate, message", [
    pytest.param(lambda d: d.update(version=2), "version 2 is not readable", id="newer-version"),
    pytest.param(lambda d: d.update(schema="other"), "schema", id="other-schema"),
    pytest.param(lambda d: d["devices"][0].update(state="sleepy"), "devices[0].state", id="unknown-state"),
    pytest.param(lambda d: d["devices"][0].update(holders=[]) or d["devices"][0].update(state="free")
                 or d["devices"][0]["holders"].append({"pid": 1}), "startTime", id="holder-missing-field"),
    pytest.param(lambda d: d["devices"][0]["holders"][0].update(pid=True), "expected an integer",
                 id="boolean-pid"),
    pytest.param(lambda d: d["devices"][0]["holders"][0].update(pid=0), "not a process id", id="pid-zero"),
    pytest.param(lambda d: d["devices"][0].update(state="free"), "state free with 1 holder", id="free-with-holder"),
    pytest.param(lambda d: d["devices"].append(d["devices"][0]), "listed twice", id="duplicate-device"),
    pytest.param(lambda d: d.update(updated=float("inf")), "finite", id="infinite-time"),
])
def test_inconsistent_content_is_refused_with_the_field_named(mutate: object, message: str) -> None:
    state = UsageState("n1", 1.0, (DeviceUsage("/dev/nvidia0", (Holder(5, 6, 7.0),), 7.0, DeviceState.BUSY),))
    document = json.loads(encode_state(state))
    mutate(document)  # type: ignore[operator]
    with pytest.raises(StateFileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_state(json.dumps(document).encode())


def test_a_write_replaces_the_file_and_leaves_no_temporary_behind(tmp_path: Path) -> None:
    file = StateFile(tmp_path / "monitor" / "state.json")
    for updated in (1.0, 2.0):
        file.write(UsageState("n1", updated, ()))
    assert file.load() == UsageState("n1", 2.0, ())
    assert sorted(p.name for p in (tmp_path / "monitor").iterdir()) == ["state.json"]


@pytest.mark.parametrize("content", [
    pytest.param(b"", id="empty"),
    pytest.param(b"\x00" * 64, id="zero-filled-block"),
    pytest.param(b'{"schema": "gpupool.io/usage-state", "vers', id="torn"),
    pytest.param(b"\xff\xfe not utf-8", id="binary"),
    pytest.param(b"[" * 100_000, id="deeply-nested"),
])
def test_an_unreadable_file_loads_as_nothing_and_is_kept_aside(tmp_path: Path, content: bytes,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    assert StateFile(path).load() is None
    assert "starting from an empty state" in caplog.text
    assert (tmp_path / "state.json.corrupt").read_bytes() == content
    assert not path.exists()


def test_no_file_loads_as_nothing_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert StateFile(tmp_path / "state.json").load() is None
    assert not caplog.text


MEMORY_DIR = Path("/dev/shm")


def _fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


@pytest.mark.parametrize(("sync", "on_disk", "expected"), [
    pytest.param(None, True, 2, id="auto-on-disk-syncs-file-and-directory"),
    pytest.param(None, False, 0, id="auto-on-tmpfs-only-renames"),
    pytest.param(True, False, 2, id="forced-on-tmpfs"),
    pytest.param(False, True, 0, id="off-on-disk"),
])
def test_fsync_unless_the_file_is_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: bool | None,
                                            on_disk: bool, expected: int) -> None:
    if on_disk and in_memory(tmp_path):
        pytest.skip("the test's temporary directory is on tmpfs here")
    if not on_disk and not in_memory(MEMORY_DIR):
        pytest.skip(f"{MEMORY_DIR} is not tmpfs here")
    directory = tmp_path if on_disk else Path(tempfile.mkdtemp(dir=MEMORY_DIR))
    try:
        file = StateFile(directory / "sub" / "state.json", sync=sync)
        calls = _fsyncs(monkeypatch)
        state = UsageState("n", 1.0, (DeviceUsage("/dev/nvidia0"),))
        file.write(state)
        assert len(calls) == expected and file.sync is (expected > 0)
        assert file.load() == state
    finally:
        if not on_disk:
            shutil.rmtree(directory)


def test_filesystem_kinds() -> None:
    assert filesystem_magic("/proc") is not None and not in_memory("/proc")
    assert filesystem_magic("/no/such/dir") is None and not in_memory("/no/such/dir")
