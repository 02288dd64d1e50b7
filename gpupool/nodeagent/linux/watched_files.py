"""Which device files are watched, and how a file seen through any path is matched to one of them.

A container reaches a GPU through its own device node (runc creates or bind-mounts it in the
container's /dev), so a path seen inside a container need not be the host path. Files are therefore
matched by identity: a character device by its device number (``st_rdev``, the same for every node
of one GPU), any other file by (filesystem, inode), which is what the tests' regular stand-in files
need.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileKey:
    """Identity of a file independent of the path it was reached by."""

    char_device: bool
    major: int
    minor: int

    @staticmethod
    def of(st: os.stat_result) -> FileKey:
        """The key of a stat result: device number for character devices, else (st_dev, st_ino)."""
        if stat.S_ISCHR(st.st_mode):
            return FileKey(True, os.major(st.st_rdev), os.minor(st.st_rdev))
        return FileKey(False, st.st_dev, st.st_ino)


class WatchedFiles:
    """The watched paths and their keys; a path that does not exist (yet) is kept and retried."""

    def __init__(self, paths: Iterable[str]) -> None:
        self._paths = tuple(dict.fromkeys(paths))
        if not self._paths:
            raise ValueError("no device files to watch")
        self.base_names = frozenset(os.path.basename(path) for path in self._paths)
        """The watched paths' last components: a descriptor whose link target ends otherwise is no watched file."""
        self._by_key: dict[FileKey, str] = {}
        self.missing: tuple[str, ...] = ()
        self.refresh()

    @property
    def paths(self) -> tuple[str, ...]:
        """Every watched path, present or not, in the order given."""
        return self._paths

    def refresh(self) -> None:
        """Re-read the keys (a device file that disappeared and came back gets a new inode)."""
        by_key: dict[FileKey, str] = {}
        missing: list[str] = []
        for path in self._paths:
            try:
                by_key.setdefault(FileKey.of(os.stat(path)), path)
            except OSError as exc:
                missing.append(path)
                if path not in self.missing:
                    log.warning("watched device file %s is not there (%s); retried until it is",
                                path, exc.strerror)
        for path in set(self.missing) - set(missing):
            log.info("watched device file %s is back", path)
        self._by_key = by_key
        self.missing = tuple(missing)

    def path_of(self, key: FileKey) -> str | None:
        """The watched path with this identity, or ``None`` when the file is not watched."""
        return self._by_key.get(key)

    def path_of_fd(self, fd: int) -> str | None:
        """The watched path an open file descriptor of this process refers to."""
        try:
            return self.path_of(FileKey.of(os.fstat(fd)))
        except OSError:
            return None
