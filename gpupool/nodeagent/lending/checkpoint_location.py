"""Whether the checkpoint root is storage other nodes can reach, read from the kernel's mount table.

Checkpoints move with their task only when ``--checkpoint-dir`` is a mount every node shares
(docs/lending.md, "Where checkpoints live"). A node whose NFS mount failed at boot still has the
directory, on its local disk, and nothing else would tell: a reclaimed borrower replaced on another
node would silently start over. So the agent names, at start, the file system under the root (the
longest mount point above it in ``/proc/self/mountinfo``) and warns when it is a local one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"

NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "ceph", "fuse.ceph-fuse", "glusterfs", "fuse.glusterfs", "lustre", "gpfs",
    "beegfs", "fuse.juicefs", "fuse.s3fs", "fuse.sshfs", "9p", "virtiofs", "ocfs2", "gfs2",
})
"""File systems whose content other nodes can see (network and cluster file systems)."""


@dataclass(frozen=True)
class Location:
    """The mount a path lives on."""

    mount_point: str
    fstype: str
    source: str

    @property
    def shared(self) -> bool:
        return self.fstype in NETWORK_FILESYSTEMS


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def location_of(path: str, mountinfo: str) -> Location | None:
    """The mount ``path`` (absolute, resolved) lives on, from the text of a mountinfo file."""
    best: Location | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        point = _unescape(fields[4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best.mount_point)):
            best = Location(point, tail[0], _unescape(tail[1]))
    return best


def describe(root: str, mountinfo_path: str = MOUNTINFO) -> tuple[bool, str]:
    """(whether ``root`` is on shared storage, a sentence for the agent's log)."""
    resolved = os.path.realpath(root)
    try:
        with open(mountinfo_path, encoding="utf-8", errors="replace") as fh:
            found = location_of(resolved, fh.read())
    except OSError as exc:
        return False, f"checkpoints under {root}: the mount table cannot be read ({exc}); shared or not is unknown"
    if found is None:
        return False, f"checkpoints under {root}: no mount found for it; shared or not is unknown"
    if found.shared:
        return True, (f"checkpoints under {root} on {found.fstype} ({found.source} at {found.mount_point}): "
                      "a task's next pod resumes on any node that mounts it")
    return False, (f"checkpoints under {root} on {found.fstype} at {found.mount_point}, local to this node: a "
                   "borrower replaced on another node starts over (name a shared mount with --checkpoint-dir)")
