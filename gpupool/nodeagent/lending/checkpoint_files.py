"""Choosing the checkpoint a task resumes from, and refusing the ones that cannot be trusted.

A task's directory may live on storage every node mounts (NFS, CephFS): a checkpoint was written
by a process on another node that may have died mid-write, and whatever the directory holds was
written by the tenant's own containers. So a file is a checkpoint only when

- its name does not start with ``.`` (work in progress, by the protocol: write under a dot name,
  then rename) and does not end with :data:`DIGEST_SUFFIX` (a digest, below);
- it is a regular file, not a symlink (the agent never follows a tenant's link out of the
  directory), and not empty;
- where the workload wrote ``<name>.sha256`` beside it (``sha256sum`` output: the hex digest first),
  the file's SHA-256 equals it. The digest is written (under a dot name, renamed) *before* the
  checkpoint is renamed into place, so a checkpoint cut short after its digest fails the check.

A directory is a checkpoint only when it is a process dump of ``criu-run`` (the wrapper that dumps a
workload with CRIU, docs/lending.md): its name starts with :data:`CRIU_PREFIX` (the wrapper dumps
under ``.criu-<n>`` and renames), it is a directory and not a link, and it holds CRIU's
:data:`CRIU_INVENTORY` as a non-empty regular file (CRIU writes it last of the images it needs).
Any other directory is passed over, as before.

The newest entry that passes (by modification time, then name) is resumed from; each one skipped is
logged with the reason. Nothing here raises: an unreadable directory resumes from nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from dataclasses import dataclass

log = logging.getLogger(__name__)

DIGEST_SUFFIX = ".sha256"
CRIU_PREFIX = "criu-"
"""The name of a process dump by ``criu-run``: ``criu-<n>``."""
CRIU_INVENTORY = "inventory.img"
"""The file every CRIU image directory holds; a restore starts by reading it."""
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Candidate:
    """A finished-looking file of a task directory."""

    name: str
    mtime_ns: int
    size: int
    """The file's size; -1 for anything but a regular file."""
    directory: bool = False
    """A real directory (not a link to one)."""


def newest_checkpoint(directory: str) -> str | None:
    """The name of the newest checkpoint in ``directory`` that passes every check, if any."""
    try:
        entries = list(os.scandir(directory))
    except OSError as exc:
        log.warning("checkpoint directory %s cannot be read (%s): the task starts over", directory, exc)
        return None
    candidates: list[Candidate] = []
    for entry in entries:
        if entry.name.startswith(".") or entry.name.endswith(DIGEST_SUFFIX):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        candidates.append(Candidate(entry.name, info.st_mtime_ns, info.st_size if stat.S_ISREG(info.st_mode) else -1,
                                    directory=stat.S_ISDIR(info.st_mode)))
    for candidate in sorted(candidates, key=lambda c: (c.mtime_ns, c.name), reverse=True):
        problem = checkpoint_problem(directory, candidate)
        if problem is None:
            return candidate.name
        log.warning("checkpoint %s ignored: %s", os.path.join(directory, candidate.name), problem)
    return None


def checkpoint_problem(directory: str, candidate: Candidate) -> str | None:
    """Why ``candidate`` is not a checkpoint to resume from, or ``None`` when it is one."""
    if candidate.directory:
        return criu_dump_problem(os.path.join(directory, candidate.name))
    if candidate.size < 0:
        return "not a regular file (a link or a directory)"
    if candidate.size == 0:
        return "empty (a write cut short)"
    expected = _digest_said(os.path.join(directory, candidate.name + DIGEST_SUFFIX))
    if expected is None:
        return None
    if expected == "":
        return f"its {DIGEST_SUFFIX} file holds no SHA-256 digest"
    actual = _sha256(os.path.join(directory, candidate.name))
    if actual is None:
        return "cannot be read"
    if actual != expected:
        return (f"SHA-256 {actual[:12]}... differs from its {DIGEST_SUFFIX} file's {expected[:12]}... "
                "(partial or corrupt)")
    return None


def criu_dump_problem(path: str) -> str | None:
    """Why the directory ``path`` is not a finished ``criu-run`` dump, or ``None`` when it is one."""
    if not os.path.basename(path).startswith(CRIU_PREFIX):
        return f"a directory, and not a process dump (those are named {CRIU_PREFIX}<n>)"
    try:
        info = os.lstat(os.path.join(path, CRIU_INVENTORY))
    except OSError:
        return f"a process dump without CRIU's {CRIU_INVENTORY} (cut short)"
    if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
        return f"its {CRIU_INVENTORY} is not a non-empty regular file"
    return None


def _digest_said(path: str) -> str | None:
    """The digest a ``.sha256`` file names; ``None``: no such file; ``""``: one without a digest."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return ""
        try:
            head = fh.read(256).split(maxsplit=1)
        except OSError:
            return ""
    word = head[0].decode("ascii", errors="replace").lower() if head else ""
    return word if len(word) == 64 and all(c in "0123456789abcdef" for c in word) else ""


def _sha256(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        try:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
        except OSError:
            return None
    return digest.hexdigest()
