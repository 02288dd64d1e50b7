"""The one path every cached build of the test environment takes (``gobuild.ensure_built``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpupool.testenv.errors import BuildFailedError, BuildImpossibleError
from gpupool.testenv.gobuild import ensure_built
from gpupool.testenv.steps import Log


@pytest.fixture(autouse=True)
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("GPUPOOL_TESTENV_CACHE", str(tmp_path))
    return tmp_path


class Recorder:
    """A cache entry that exists once ``make`` ran, and the locks taken on the way."""

    def __init__(self) -> None:
        self.entry: str | None = None
        self.locks: list[str] = []
        self.makes = 0

    def find(self) -> str | None:
        return self.entry

    def make(self, logs: Path) -> None:
        assert logs.is_dir(), "the build's logs directory exists before it runs"
        self.makes += 1
        self.entry = "built"

    @contextmanager
    def lock(self, path: Path, log: Log) -> Iterator[None]:
        self.locks.append(path.name)
        yield


def test_a_hit_neither_locks_nor_builds() -> None:
    r = Recorder()
    r.entry = "cached"
    assert ensure_built(r.find, r.make, what="x", lock_name=".x.lock", problem=lambda: "no Go", lock=r.lock) == "cached"
    assert r.locks == [] and r.makes == 0


def test_a_miss_builds_once_under_the_named_lock() -> None:
    r = Recorder()
    assert ensure_built(r.find, r.make, what="x", lock_name=".x.lock", problem=lambda: None, lock=r.lock) == "built"
    assert r.locks == [".x.lock"] and r.makes == 1


def test_a_build_finished_by_another_process_while_waiting_is_not_repeated() -> None:
    r = Recorder()

    @contextmanager
    def lock_then_someone_else_built(path: Path, log: Log) -> Iterator[None]:
        r.entry = "built elsewhere"
        yield

    got = ensure_built(r.find, r.make, what="x", lock_name=".x.lock", problem=lambda: None,
                       lock=lock_then_someone_else_built)
    assert got == "built elsewhere" and r.makes == 0


def test_a_machine_that_cannot_build_says_why_before_locking() -> None:
    r = Recorder()
    with pytest.raises(BuildImpossibleError, match="Go not found"):
        ensure_built(r.find, r.make, what="x", lock_name=".x.lock", problem=lambda: "Go not found", lock=r.lock)
    assert r.locks == [] and r.makes == 0


def test_a_build_that_leaves_no_entry_is_a_failure_naming_what() -> None:
    r = Recorder()
    with pytest.raises(BuildFailedError, match=r"KWOK v0\.8\.0"):
        ensure_built(r.find, lambda logs: None, what="KWOK v0.8.0", lock_name=".x.lock", problem=lambda: None,
                     lock=r.lock)
