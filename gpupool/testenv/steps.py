"""The primitives every build step of the test environment shares: a lock, a logged subprocess,
an atomic install of a file.

Why a lock: builds take minutes and several processes (two pytest sessions, the CLI) may ask for
the same binaries at once; an exclusive ``flock`` makes one of them build while the others wait and
then use the result. The kernel drops the lock of a process that dies, so no stale lock remains.
"""

from __future__ import annotations

import fcntl
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

Log = Callable[[str], None]


def quiet(_: str) -> None:
    """Default progress sink: say nothing."""


@contextmanager
def exclusive_lock(path: Path, log: Log) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path``; the kernel releases it if the holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another process is building the test environment; waiting for {path}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_step(
    cmd: Sequence[str],
    log_path: Path,
    *,
    failure: type[Exception],
    step: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> None:
    """Run one build step with its output in ``log_path``; raise ``failure`` naming the step, the
    log and its tail."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as out:
        try:
            rc = subprocess.run(list(cmd), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, check=False).returncode
        except OSError as exc:
            raise failure(f"{step}: cannot run {cmd[0]}: {exc}") from exc
    if rc != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise failure(f"{step} failed (exit {rc}); full log: {log_path}\n{tail}")


def install(built: Path, target: Path) -> None:
    """Copy a built file into place atomically: a reader sees the old file or the whole new one,
    and a process already running the old file keeps it (``rename`` replaces the name only)."""
    tmp = target.with_name(f".{target.name}.copy")
    tmp.write_bytes(built.read_bytes())
    tmp.chmod(0o755)
    tmp.replace(target)
