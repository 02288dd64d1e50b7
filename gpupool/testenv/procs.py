"""Child processes of the test environment: start with a log file, wait for readiness, stop.

A :class:`ManagedProcess` can also be rebuilt from a JSON record by another process (``gpupool
testenv down`` stops what ``up`` started). Before signalling such a process we check that its pid
still runs the same executable, so a recycled pid is never killed by mistake.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.testenv.errors import StartupError


@dataclass
class ManagedProcess:
    """One long-running component (etcd, kube-apiserver, ...) and where its output goes."""

    name: str
    pid: int
    executable: Path
    log_path: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        """Whether the process still runs (and, for adopted pids, still runs ``executable``)."""
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_runs(self.pid, self.executable)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; returns once the process is gone."""
        if not self.alive():
            return
        self._signal(signal.SIGTERM)
        if self._wait(timeout):
            return
        self._signal(signal.SIGKILL)
        if not self._wait(10.0):
            raise RuntimeError(f"{self.name} (pid {self.pid}) survived SIGKILL")

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def to_record(self) -> dict[str, Any]:
        """A JSON-serialisable description (see :meth:`from_record`)."""
        return {"name": self.name, "pid": self.pid, "executable": str(self.executable),
                "log_path": str(self.log_path)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ManagedProcess:
        """Adopt a process started by another Python process from its record."""
        return cls(name=str(record["name"]), pid=int(record["pid"]),
                   executable=Path(record["executable"]), log_path=Path(record["log_path"]))

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def _wait(self, timeout: float) -> bool:
        if self.popen is not None:
            try:
                self.popen.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(0.1)
        return not self.alive()


def pid_runs(pid: int, executable: Path) -> bool:
    """Whether ``pid`` is a live (non-zombie) process whose executable is ``executable``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()[0]
    return state not in ("Z", "X") and Path(exe.removesuffix(" (deleted)")) == executable.resolve()


def spawn(
    name: str,
    argv: Sequence[str | os.PathLike[str]],
    log_path: Path,
    *,
    executable: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> ManagedProcess:
    """Start ``argv`` in its own session with stdout and stderr appended to ``log_path``.

    Its own session keeps Ctrl-C in a terminal from reaching the components before our cleanup
    runs, and lets ``gpupool testenv up`` exit while they keep running. ``executable`` is what the
    pid will finally run (differs from ``argv[0]`` when a wrapper execs it).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            [os.fspath(a) for a in argv], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=cwd, env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    return ManagedProcess(name=name, pid=popen.pid, executable=Path(executable or argv[0]),
                          log_path=log_path, popen=popen)


def wait_until(
    ready: Callable[[], bool],
    *,
    what: str,
    timeout: float,
    watch: Sequence[ManagedProcess] = (),
    interval: float = 0.2,
) -> None:
    """Poll ``ready`` until it returns true; fail early if a watched process exits.

    ``ready`` may raise ``OSError`` (connection refused while a server starts): that counts as
    not ready yet.
    """
    deadline = time.monotonic() + timeout
    while True:
        for proc in watch:
            if not proc.alive():
                raise StartupError(f"{proc.name} exited while waiting for {what}; log {proc.log_path}:\n"
                                   f"{proc.log_tail()}")
        try:
            if ready():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            logs = "".join(f"\n--- {p.name} ({p.log_path}):\n{p.log_tail()}" for p in watch)
            raise StartupError(f"timed out after {timeout:.0f}s waiting for {what}{logs}")
        time.sleep(interval)
