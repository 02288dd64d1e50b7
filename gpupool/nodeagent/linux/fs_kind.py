"""Whether a directory lives in memory (tmpfs, ramfs): there fsync buys nothing.

Asked through ``statfs(2)`` (``f_type``, the filesystem's magic number) via ctypes on libc; Python
has ``os.statvfs`` but it lacks the type. Anything that fails to answer counts as a disk, so the
caller keeps its fsyncs: the safe side.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

TMPFS_MAGIC = 0x01021994
RAMFS_MAGIC = 0x858458F6
MEMORY_FILESYSTEMS = frozenset({TMPFS_MAGIC, RAMFS_MAGIC})
_STATFS_BYTES = 256
"""Room for ``struct statfs`` (120 bytes on x86-64); ``f_type`` is its first word on every Linux ABI."""


def filesystem_magic(path: str | os.PathLike[str]) -> int | None:
    """``f_type`` of the filesystem holding ``path``, or None when statfs cannot answer."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    buffer = ctypes.create_string_buffer(_STATFS_BYTES)
    if libc.statfs(os.fsencode(path), buffer) != 0:
        log.debug("statfs(%s) failed: %s", path, os.strerror(ctypes.get_errno()))
        return None
    return ctypes.c_ulong.from_buffer(buffer).value & 0xFFFFFFFF


def in_memory(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is on tmpfs or ramfs (False when unknown)."""
    return filesystem_magic(path) in MEMORY_FILESYSTEMS
