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

The newest file that passes (by modification time, then name) is resumed from; each one skipped is
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
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Candidate:
    """A finished-looking file of a task directory."""

    name: str
    mtime_ns: int
    size: int


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
        candidates.append(Candidate(entry.name, info.st_mtime_ns, info.st_size if stat.S_ISREG(info.st_mode) else -1))
    for candidate in sorted(candidates, key=lambda c: (c.mtime_ns, c.name), reverse=True):
        problem = checkpoint_problem(directory, candidate)
        if problem is None:
            return candidate.name
        log.warning("checkpoint %s ignored: %s", os.path.join(directory, candidate.name), problem)
    return None


def checkpoint_problem(directory: str, candidate: Candidate) -> str | None:
    """Why ``candidate`` is not a checkpoint to resume from, or ``None`` when it is one."""
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
