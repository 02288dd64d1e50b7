"""replace_file: whole content or the old one, the mode asked for, no temporary left on failure."""

from __future__ import annotations

import os
import secrets
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.files.replace import replace_file


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _only(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.fixture
def strict_umask() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def test_text_and_bytes_replace_the_file(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    replace_file(target, "first ü")
    assert target.read_text(encoding="utf-8") == "first ü"
    replace_file(str(target), b"\x00second")
    assert target.read_bytes() == b"\x00second"
    assert _only(tmp_path) == ["f.json"]


def test_the_mode_defaults_to_owner_only_and_is_what_is_asked_whatever_the_umask(
        tmp_path: Path, strict_umask: None) -> None:
    secret, public = tmp_path / "tokens", tmp_path / "report"
    replace_file(secret, "t")
    replace_file(public, "r", mode=0o644)
    assert _mode(secret) == 0o600
    assert _mode(public) == 0o644
    replace_file(public, "executable", mode=0o755)  # replacing sets the new file's mode, not the old one's
    assert _mode(public) == 0o755


@pytest.mark.parametrize("failing", ["write", "fchmod", "fsync", "replace"])
def test_a_failure_before_the_rename_leaves_the_old_file_and_no_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")

    def fail(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, fail)
    with pytest.raises(OSError, match="No space"):
        replace_file(target, "new", mode=0o644, durable=True)
    assert target.read_text() == "old"
    assert _only(tmp_path) == ["state.json"]


def test_an_interrupt_mid_write_cleans_up_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "loans.json"
    target.write_text("old")

    def interrupted(_: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        replace_file(target, "new", durable=True)
    assert target.read_text() == "old"
    assert _only(tmp_path) == ["loans.json"]


def test_durable_syncs_the_file_then_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def record(fd: int) -> None:
        synced.append("directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    replace_file(tmp_path / "a", "x")
    assert synced == []
    replace_file(tmp_path / "a", "y", durable=True)
    assert synced == ["file", "directory"]


def test_a_directory_that_cannot_be_synced_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fsync = os.fsync

    def no_directory_sync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(22, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", no_directory_sync)
    replace_file(tmp_path / "a", "y", durable=True)
    assert (tmp_path / "a").read_text() == "y"


def test_a_missing_directory_is_an_error_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        replace_file(tmp_path / "absent" / "f", "x")
    assert _only(tmp_path) == []


def test_readers_see_one_whole_version_while_writers_race(tmp_path: Path) -> None:
    target = tmp_path / "clients.json"
    versions = [bytes([ord("a") + n]) * 200_000 for n in range(4)]
    replace_file(target, versions[0])
    seen: set[bytes] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add(target.read_bytes())

    def write(version: bytes) -> None:
        for _ in range(30):
            replace_file(target, version)

    reader = threading.Thread(target=read)
    writers = [threading.Thread(target=write, args=(version,)) for version in versions[1:]]
    reader.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    done.set()
    reader.join()
    assert seen <= set(versions)
    assert target.read_bytes() in versions[1:]
    assert _only(tmp_path) == ["clients.json"]


def test_a_temporary_name_taken_by_a_crashed_writer_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    leftover = tmp_path / ".f.aaaa.tmp"
    leftover.write_text("left by a crash")
    names = iter(["aaaa", "bbbb"])
    monkeypatch.setattr(secrets, "token_hex", lambda _: next(names))
    replace_file(tmp_path / "f", "new")
    assert (tmp_path / "f").read_text() == "new"
    assert leftover.read_text() == "left by a crash"  # another writer's file is never opened
    assert _only(tmp_path) == [".f.aaaa.tmp", "f"]
