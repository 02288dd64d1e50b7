"""Writing the lending side's small JSON files so that a crash leaves the old file or the new one.

A node agent can be killed at any instruction (SIGKILL, OOM, the node losing power). The loans and
the reclaim journal are read back by the next agent, so each write goes to a temporary file in the
same directory, is flushed to the disk (``fsync``), then renamed over the old file, and the
directory is synced so that the rename itself survives a power loss. A reader never sees half a
file; at worst it sees the previous one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any


def write_json_atomically(path: str, doc: Any, prefix: str) -> None:
    """Replace ``path`` with ``doc`` as JSON (temporary file, fsync, rename, fsync of the directory)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    """Make the rename durable; a file system that cannot sync a directory is not an error."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
