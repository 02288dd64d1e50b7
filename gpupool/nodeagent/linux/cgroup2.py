"""Where the cgroup v2 hierarchy is mounted, and a process's or a container's directory in it.

Device programs attach to cgroup v2 directories only. On a hybrid host (cgroup v1 controllers,
as this repo's test machine and many production nodes) the v2 hierarchy is mounted beside them
(``/sys/fs/cgroup/unified``); on a pure v2 host it is ``/sys/fs/cgroup`` itself. Either way a
process's v2 directory is the ``0::`` line of ``/proc/<pid>/cgroup``, relative to that mount.
"""

from __future__ import annotations

import os

MOUNTINFO = "/proc/self/mountinfo"
CGROUP2_FSTYPE = "cgroup2"
_V2_PREFIX = "0::"


class Cgroup2Error(RuntimeError):
    """No cgroup v2 hierarchy, or a cgroup that is not in it; the message says which."""


def cgroup2_mount(mountinfo: str = MOUNTINFO) -> str | None:
    """The first mount point of a cgroup2 filesystem, ``None`` when none is mounted."""
    try:
        with open(mountinfo, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        # fields: id parent major:minor root mount-point options [optional...] - fstype source super
        left, sep, right = line.partition(" - ")
        if sep and right.split(" ", 1)[0] == CGROUP2_FSTYPE:
            return _unescape(left.split(" ")[4])
    return None


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field


def cgroup2_path_of_pid(pid: int, proc: str = "/proc") -> str:
    """The process's cgroup v2 path (``/k8s.io/<id>``), relative to the cgroup2 mount."""
    path = os.path.join(proc, str(pid), "cgroup")
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise Cgroup2Error(f"cannot read {path}: {exc.strerror}") from None
    for line in lines:
        if line.startswith(_V2_PREFIX):
            return line[len(_V2_PREFIX):] or "/"
    raise Cgroup2Error(f"{path} has no cgroup v2 line ({_V2_PREFIX}); is cgroup2 mounted?")


def cgroup2_join(cgroup: str, mount: str) -> str:
    """The directory of ``cgroup`` (existing or not): a path under ``mount`` as given, or a cgroup
    path as ``/proc/<pid>/cgroup`` writes it (``/k8s.io/<id>``) joined to ``mount``. Raises
    :class:`Cgroup2Error` for a path that leaves the hierarchy."""
    root = os.path.realpath(mount)
    given = os.path.realpath(cgroup) if cgroup.startswith(root + os.sep) else \
        os.path.realpath(os.path.join(root, cgroup.lstrip("/")))
    if given != root and not given.startswith(root + os.sep):
        raise Cgroup2Error(f"cgroup {cgroup!r} is outside the cgroup2 hierarchy at {mount}")
    return given


def cgroup2_directory(cgroup: str, mount: str) -> str:
    """:func:`cgroup2_join`, and the directory must be a cgroup that exists now."""
    given = cgroup2_join(cgroup, mount)
    if not os.path.isfile(os.path.join(given, "cgroup.procs")):
        raise Cgroup2Error(f"no cgroup2 directory {given} (for {cgroup!r}); has the container exited?")
    return given
