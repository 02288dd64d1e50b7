"""The recorder's view of live processes: start times, and who holds the watched files now.

A port so that the recorder's rules are tested with a scripted table; :class:`ProcfsTable` reads
/proc for real.
"""

from __future__ import annotations

from typing import Protocol

from gpupool.nodeagent.linux.procfs import PROC, all_pids, held_files, process_start_time
from gpupool.nodeagent.linux.watched_files import WatchedFiles


class ProcessTable(Protocol):
    """What the recorder asks about processes."""

    def start_time(self, pid: int) -> int | None:
        """Start time of ``pid`` (clock ticks since boot), ``None`` when it does not exist."""
        ...

    def holds(self, pid: int, path: str) -> bool:
        """Whether ``pid`` holds the watched ``path`` open now."""
        ...

    def holders(self) -> dict[str, set[int]]:
        """Every watched path held now, with the pids holding it."""
        ...


class ProcfsTable:
    """:class:`ProcessTable` over /proc."""

    def __init__(self, watched: WatchedFiles, proc: str = PROC) -> None:
        self._watched = watched
        self._proc = proc

    def start_time(self, pid: int) -> int | None:
        """Field 22 of /proc/<pid>/stat."""
        return process_start_time(pid, self._proc)

    def holds(self, pid: int, path: str) -> bool:
        """Whether one of the process's fds is ``path`` (by file identity)."""
        return path in held_files(pid, self._watched, self._proc)

    def holders(self) -> dict[str, set[int]]:
        """A scan of every process's fd table."""
        if self._watched.missing:
            self._watched.refresh()
        found: dict[str, set[int]] = {}
        for pid in all_pids(self._proc):
            for path in held_files(pid, self._watched, self._proc):
                found.setdefault(path, set()).add(pid)
        return found
