"""The primitives every build step of the test environment shares: a lock, a logged subprocess,
an atomic install of a file.

Why a lock: builds take minutes and several processes (two pytest sessions, the CLI) may ask for
the same binaries at once; an exclusive ``flock`` makes one of them build while the others wait and
then use the result. The kernel drops the lock of a process that dies, so no stale lock remains.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from gpupool.testenv.errors import BuildImpossibleError

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


def apt_install(packages: Sequence[str], label: str, logs: Path, log: Log, *,
                run: Callable[..., None] = run_step) -> None:
    """``apt-get install`` ``packages`` (no recommends); on failure refresh the package lists once and
    retry: a fresh machine's lists are often stale. ``label`` names the logs and the steps; callers
    pass their module's ``run_step`` so that each stays replaceable where it is used. A failure
    after the retry is a :class:`BuildImpossibleError` naming the step and its log."""
    install_log = logs / f"apt-install-{label}.log"
    log(f"installing {' '.join(packages)} with apt-get (log: {install_log})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    step = f"apt-get install ({label})"
    try:
        run(cmd, install_log, env=env, failure=BuildImpossibleError, step=step)
    except BuildImpossibleError:
        run(["apt-get", "update"], logs / f"apt-update-{label}.log", env=env, failure=BuildImpossibleError,
            step="apt-get update")
        run(cmd, install_log, env=env, failure=BuildImpossibleError, step=step)
