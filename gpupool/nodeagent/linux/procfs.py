"""What the monitor reads from /proc: process start times and the files a process holds open.

A PID alone does not name a process for long: the kernel reuses PIDs. A process is identified by
(pid, start time), the start time being field 22 of ``/proc/<pid>/stat`` in clock ticks since boot.
Every read tolerates the process vanishing in between (it answers ``None`` or nothing).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from gpupool.nodeagent.linux.watched_files import FileKey, WatchedFiles

PROC = "/proc"
_STARTTIME_FIELD_AFTER_COMM = 19  # field 22 overall; fields after ")" start at field 3
_STAT_READ_BYTES = 4096  # /proc/<pid>/stat is one line of a few hundred bytes
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def process_start_time(pid: int, proc: str = PROC) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or ``None`` when no such process exists."""
    try:  # os-level calls: this runs for every holder every scan, buffered file objects cost more
        fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, _STAT_READ_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
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


@dataclass(frozen=True)
class HeldDescriptor:
    """One descriptor of a process that refers to a watched file: its number, link text and watched path."""

    fd: str
    target: str
    path: str


def held_files(pid: int, watched: WatchedFiles, proc: str = PROC) -> set[str]:
    """The watched paths process ``pid`` holds open now (empty when it is gone or unreadable)."""
    return {held.path for held in held_descriptors(pid, watched, proc)}


def held_descriptors(pid: int, watched: WatchedFiles, proc: str = PROC) -> tuple[HeldDescriptor, ...]:
    """The descriptors of ``pid`` that refer to watched files (empty when it is gone or unreadable).

    Link targets are read first (cheap) and only files whose target names a watched file by base
    name (a container's own /dev node has the host's base name) are stat'ed for their identity.
    This runs for many processes every scan interval, so it is written for few system calls and
    little Python per descriptor: the fd directory is opened once and each link is read relative to
    it, and base names are compared by slicing.
    """
    try:
        fd_dir = os.open(f"{proc}/{pid}/fd", _DIRECTORY_FLAGS)
    except OSError:
        return ()
    try:
        names = watched.base_names
        held: list[HeldDescriptor] = []
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(fd, dir_fd=fd_dir)
                if target[target.rfind("/") + 1:] not in names:
                    continue
                path = watched.path_of(FileKey.of(os.stat(fd, dir_fd=fd_dir)))
            except OSError:
                continue
            if path is not None:
                held.append(HeldDescriptor(fd, target, path))
        return tuple(held)
    except OSError:
        return ()
    finally:
        os.close(fd_dir)


def still_held(pid: int, descriptors: tuple[HeldDescriptor, ...], proc: str = PROC) -> bool:
    """Whether ``pid`` still holds every path of ``descriptors``: for each path, one of its
    descriptors still links to the same target (usually one ``readlink`` per path).

    The cheap check of a known holder between full listings (a GPU process holds one device file
    through several descriptors): False, and the caller lists the process again, when some path has
    none left.
    """
    holding: dict[str, bool] = {}
    for held in descriptors:
        if holding.get(held.path):
            continue
        try:
            holding[held.path] = os.readlink(f"{proc}/{pid}/fd/{held.fd}") == held.target
        except OSError:
            holding[held.path] = False
    return all(holding.values())
