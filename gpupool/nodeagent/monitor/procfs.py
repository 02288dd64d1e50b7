"""What the monitor reads from /proc: process start times and the files a process holds open.

A PID alone does not name a process for long: the kernel reuses PIDs. A process is identified by
(pid, start time), the start time being field 22 of ``/proc/<pid>/stat`` in clock ticks since boot.
Every read tolerates the process vanishing in between (it answers ``None`` or nothing).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from gpupool.nodeagent.monitor.watched_files import FileKey, WatchedFiles

PROC = "/proc"
_STARTTIME_FIELD_AFTER_COMM = 19  # field 22 overall; fields after ")" start at field 3


def process_start_time(pid: int, proc: str = PROC) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or ``None`` when no such process exists."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    close = raw.rfind(b")")
    fields = raw[close + 2:].split()
    try:
        return int(fields[_STARTTIME_FIELD_AFTER_COMM])
    except (IndexError, ValueError):
        return None


def all_pids(proc: str = PROC) -> Iterator[int]:
    """PIDs of all processes visible in ``proc``."""
    try:
        names = os.listdir(proc)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def held_files(pid: int, watched: WatchedFiles, proc: str = PROC) -> set[str]:
    """The watched paths process ``pid`` holds open now (empty when it is gone or unreadable).

    Link targets are read first (cheap) and only files whose target names a watched file by path
    or by base name (a container's own /dev node) are stat'ed for their identity.
    """
    fd_dir = f"{proc}/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return set()
    names = {os.path.basename(p) for p in watched.paths}
    held: set[str] = set()
    for fd in fds:
        link = f"{fd_dir}/{fd}"
        try:
            target = os.readlink(link)
            if os.path.basename(target) not in names:
                continue
            path = watched.path_of(FileKey.of(os.stat(link)))
        except OSError:
            continue
        if path is not None:
            held.add(path)
    return held
