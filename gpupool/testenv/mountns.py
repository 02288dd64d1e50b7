"""The private mount namespace a test node's runtime holds, and the host mount points it needs.

A node's container runtime (the fake one, or containerd) is started under ``unshare --mount``
with private directories bind-mounted over the paths kubelet and the runtime write
(``/var/lib/kubelet``, ``/var/log/pods`` ...); kubelet joins that namespace with ``nsenter``. So
the machine's own directories are never written, several nodes run side by side, and every mount
made inside dies with the namespace.

A bind mount needs an existing target: paths missing on the host are created here and removed
(``rmdir``, so only while empty) when the last node that needed them stops, in any process: an
``rmdir`` of a directory that is a mount point in another mount namespace detaches that mount there,
so a process whose last node stopped must not remove a mount point a node of another process (a
second pytest run beside this one) still stands on. Every process with a node holds a shared
``flock`` on :data:`MACHINE_LOCK`; the one that can turn it exclusive when its last node stops is
the last user on the machine and removes what any of them created (listed in the lock file).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

MACHINE_LOCK = Path(tempfile.gettempdir()) / "gpupool-testenv-mount-points"
"""Shared by every process of the machine: flocked while a process has nodes; lists the host paths
created for them (one per line) until the last user removes them."""

_lock = threading.Lock()
_created: set[Path] = set()
_owners: set[str] = set()
_machine: int | None = None
"""This process's descriptor of :data:`MACHINE_LOCK` while it has owners (holding a shared lock)."""


def claim_mount_points(owner: str, paths: Sequence[Path]) -> None:
    """Make sure ``paths`` exist on the host (remembering the ones created) for ``owner``."""
    global _machine
    with _lock:
        if _machine is None:
            _machine = os.open(MACHINE_LOCK, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            fcntl.flock(_machine, fcntl.LOCK_SH)  # waits while a last user removes the paths
        for path in paths:
            if not path.exists():
                path.mkdir(parents=True, exist_ok=True)
                _created.add(path)
                os.write(_machine, f"{path}\n".encode())
        _owners.add(owner)


def release_mount_points(owner: str) -> None:
    """Remove the mount points created for nodes once no node of any process needs them."""
    global _machine
    with _lock:
        _owners.discard(owner)
        if _owners or _machine is None:
            return
        machine, _machine = _machine, None
        try:
            try:
                fcntl.flock(machine, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another process still has nodes: the last one removes them
                _created.clear()
                return
            listed = {Path(line) for line in Path(MACHINE_LOCK).read_text().splitlines() if line.startswith("/")}
            for path in sorted(listed | _created, reverse=True):
                # rmdir only succeeds on an empty directory: never delete what someone else put there.
                with contextlib.suppress(OSError):
                    path.rmdir()
            os.ftruncate(machine, 0)
            _created.clear()
        finally:
            os.close(machine)  # drops the lock


def created_mount_points() -> list[Path]:
    """The mount points (``/var/lib/kubelet`` ...) this process created on the host."""
    with _lock:
        return sorted(_created)


def remove_mount_points(paths: Sequence[Path]) -> None:
    """``rmdir`` each of ``paths`` if still empty (for ``gpupool testenv down``).

    Only call this when no node of the test environment runs: an empty mount point of a live
    node in another namespace would be detached by ``rmdir``.
    """
    for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir()


def namespace_argv(binds: Mapping[Path, Path], cwd: Path, argv: Sequence[str | Path],
                   prelude: Sequence[str] = ()) -> list[str]:
    """``unshare --mount`` running: bind mounts (host source → target), ``prelude`` (shell lines
    run after the binds, inside the namespace), ``cd cwd``, then ``exec argv``.

    ``exec`` makes the runtime the process ``Popen`` returns, so its pid names the namespace.
    Paths travel as positional arguments, never pasted into the script.
    """
    pairs = list(binds.items())
    lines = ["set -e"]
    lines += [f'mount --bind "${{{2 * i + 1}}}" "${{{2 * i + 2}}}"' for i in range(len(pairs))]
    lines += list(prelude)
    n = 2 * len(pairs) + 1
    lines += [f'cd "${{{n}}}"', f"shift {n}", 'exec "$@"']
    args = [str(p) for pair in pairs for p in pair]
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines), "sh",
            *args, str(cwd), *[str(a) for a in argv]]


def mounts_below(directory: Path, mountinfo: str) -> list[Path]:
    """Mount points at or below ``directory`` listed in a ``/proc/self/mountinfo`` text, deepest first."""
    prefix = str(directory).rstrip("/")
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def unmount_below(directory: Path) -> None:
    """Defensive: lazily unmount anything still mounted under ``directory`` in our namespace.

    Normally nothing is (the node's mounts live and die in its own namespace), but deleting a
    directory with a live bind mount under it would delete the mounted files too.
    """
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return
    for point in mounts_below(directory, mountinfo):
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
