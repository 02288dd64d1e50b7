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
import secrets

TEMP_SUFFIX = ".tmp"
"""The temporaries are ``.<name>.<random>.tmp`` beside the target: hidden, and named for clean-up by hand."""
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_CREATE_ATTEMPTS = 3  # 64 random bits: a clash is a leftover of a crashed writer at most, never twice


def replace_file(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None,
                 durable: bool = False) -> None:
    """Put ``data`` (text is written as UTF-8) at ``path`` in one step.

    ``mode``: the file's permission bits; ``None`` keeps the temporary's 0600 (owner only, the safe
    default for tokens), whatever the umask. ``durable``: fsync the file before the rename and its
    directory after it (a filesystem that cannot sync a directory is not an error: the rename is
    then as durable as that filesystem makes it). The directory must exist. Errors propagate as
    :class:`OSError`, with no temporary left behind.

    Plain descriptor calls rather than :func:`tempfile.mkstemp` and a file object: the usage
    monitor writes its state file after every open it records, and these cost half as much there.
    """
    target = os.fspath(path)
    directory, name = os.path.split(target)
    fd, staged = _create_temporary(directory or ".", name)
    try:
        try:
            view = memoryview(data.encode() if isinstance(data, str) else data)
            while view:
                view = view[os.write(fd, view):]
            if mode is not None:
                os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(staged, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        raise
    if durable:
        sync_directory(directory or ".")


def _create_temporary(directory: str, name: str) -> tuple[int, str]:
    """A new, empty, owner-only file ``.<name>.<random>.tmp`` in ``directory``, opened for writing."""
    attempts_left = _CREATE_ATTEMPTS
    while True:
        staged = os.path.join(directory, f".{name}.{secrets.token_hex(8)}{TEMP_SUFFIX}")
        try:
            return os.open(staged, _CREATE_FLAGS, 0o600), staged
        except FileExistsError:
            attempts_left -= 1
            if not attempts_left:
                raise


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
