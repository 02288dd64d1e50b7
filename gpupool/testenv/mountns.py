"""The private mount namespace a test node's runtime holds, and the host mount points it needs.

A node's container runtime (the fake one, or containerd) is started under ``unshare --mount``
with private directories bind-mounted over the paths kubelet and the runtime write
(``/var/lib/kubelet``, ``/var/log/pods`` ...); kubelet joins that namespace with ``nsenter``. So
the machine's own directories are never written, several nodes run side by side, and every mount
made inside dies with the namespace.

A bind mount needs an existing target: paths missing on the host are created here and removed
(``rmdir``, so only while empty) when the last node that needed them stops.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

_lock = threading.Lock()
_created: set[Path] = set()
_owners: set[str] = set()


def claim_mount_points(owner: str, paths: Sequence[Path]) -> None:
    """Make sure ``paths`` exist on the host (remembering the ones created) for ``owner``."""
    with _lock:
        for path in paths:
            if not path.exists():
                path.mkdir(parents=True)
                _created.add(path)
        _owners.add(owner)


def release_mount_points(owner: str) -> None:
    """Remove the mount points we created once no owner needs them any more."""
    with _lock:
        _owners.discard(owner)
        if _owners:
            return
        for path in sorted(_created, reverse=True):
            # rmdir only succeeds on an empty directory: never delete what someone else put there.
            with contextlib.suppress(OSError):
                path.rmdir()
        _created.clear()


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
