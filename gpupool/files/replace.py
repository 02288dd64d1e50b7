"""Replace a file whole: its readers see the old content or the new, never a part.

The content goes to a temporary file of a unique name beside the target (same directory, hence the
same filesystem), which ``rename(2)`` then puts over the target in one step. A unique name lets two
writers of one file (threads, processes) run at once: the last rename wins, neither clobbers the
other's half-written temporary. Any failure before the rename (a full disk, a failed fsync, an
interrupt) removes the temporary and leaves the target as it was.

Durability is a choice, because it costs two fsyncs (milliseconds on a disk): ``durable=True``
flushes the temporary to the disk before the rename and syncs the directory after it, so that a
power loss leaves the old file or the new one; without it the rename is atomic for readers but the
kernel may write the data back later. A file on tmpfs or one rewritten every few seconds from live
state needs no durability; a record read back after a crash does.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

TEMP_SUFFIX = ".tmp"
"""The temporaries are ``.<name>.<random>.tmp`` beside the target: hidden, and named for clean-up by hand."""


def replace_file(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None,
                 durable: bool = False) -> None:
    """Put ``data`` (text is written as UTF-8) at ``path`` in one step.

    ``mode``: the file's permission bits; ``None`` keeps the temporary's 0600 (owner only, the safe
    default for tokens), whatever the umask. ``durable``: fsync the file before the rename and its
    directory after it (a filesystem that cannot sync a directory is not an error: the rename is
    then as durable as that filesystem makes it). The directory must exist. Errors propagate as
    :class:`OSError`, with no temporary left behind.
    """
    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    fd, staged = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=TEMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
            if mode is not None:
                os.fchmod(out.fileno(), mode)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(staged, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        raise
    if durable:
        sync_directory(directory)


def sync_directory(directory: str | os.PathLike[str]) -> None:
    """Make the renames in ``directory`` durable; a filesystem that cannot sync a directory (or a
    directory that cannot be opened) is not an error."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
