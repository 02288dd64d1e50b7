"""The fanotify system-call interface through ctypes: constants, the event record, init and mark.

Only what the fanotify event source needs (see ``man 7 fanotify``). Kept apart from the source so
that the byte-level parsing is a pure function the tests can feed directly.
"""

from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass

FAN_CLOEXEC = 0x0000_0001
FAN_NONBLOCK = 0x0000_0002
FAN_CLASS_NOTIF = 0x0000_0000
FAN_CLASS_CONTENT = 0x0000_0004

FAN_MARK_ADD = 0x0000_0001
FAN_MARK_REMOVE = 0x0000_0002
FAN_MARK_FLUSH = 0x0000_0080

FAN_CLOSE_WRITE = 0x0000_0008
FAN_CLOSE_NOWRITE = 0x0000_0010
FAN_OPEN = 0x0000_0020
FAN_OPEN_PERM = 0x0001_0000
FAN_Q_OVERFLOW = 0x0000_4000

FAN_ALLOW = 0x01
FAN_DENY = 0x02

FAN_NOFD = -1
FANOTIFY_METADATA_VERSION = 3

_METADATA = struct.Struct("=IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid
_RESPONSE = struct.Struct("=iI")  # fd, response

CLOSE_MASK = FAN_CLOSE_WRITE | FAN_CLOSE_NOWRITE
READ_BUFFER_BYTES = 64 * 1024


class FanotifyError(OSError):
    """fanotify_init or fanotify_mark failed; ``errno`` says why (EPERM: no CAP_SYS_ADMIN)."""


@dataclass(frozen=True)
class RawEvent:
    """One ``struct fanotify_event_metadata``: the event mask, the file's fd (ours to close), the pid."""

    mask: int
    fd: int
    pid: int


def parse_events(buffer: bytes) -> list[RawEvent]:
    """Split a ``read()`` of the fanotify fd into events; a record of an unknown version or a
    truncated record raises ``ValueError`` (the reader then drops the buffer, it cannot resync)."""
    events: list[RawEvent] = []
    offset = 0
    while offset < len(buffer):
        if len(buffer) - offset < _METADATA.size:
            raise ValueError(f"truncated fanotify record at byte {offset} of {len(buffer)}")
        event_len, version, _reserved, _metadata_len, mask, fd, pid = _METADATA.unpack_from(buffer, offset)
        if version != FANOTIFY_METADATA_VERSION:
            raise ValueError(f"fanotify metadata version {version}, expected {FANOTIFY_METADATA_VERSION}")
        if event_len < _METADATA.size or offset + event_len > len(buffer):
            raise ValueError(f"bad fanotify record length {event_len} at byte {offset}")
        events.append(RawEvent(mask=mask, fd=fd, pid=pid))
        offset += event_len
    return events


def encode_metadata(mask: int, fd: int, pid: int) -> bytes:
    """One event record as the kernel writes it (for tests of :func:`parse_events`)."""
    return _METADATA.pack(_METADATA.size, FANOTIFY_METADATA_VERSION, 0, _METADATA.size, mask, fd, pid)


def encode_response(fd: int, allow: bool) -> bytes:
    """The ``struct fanotify_response`` that answers a permission event."""
    return _RESPONSE.pack(fd, FAN_ALLOW if allow else FAN_DENY)


class Fanotify:
    """Thin wrapper over libc's ``fanotify_init`` / ``fanotify_mark``."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._init = libc.fanotify_init
        self._init.argtypes = [ctypes.c_uint, ctypes.c_uint]
        self._init.restype = ctypes.c_int
        self._mark = libc.fanotify_mark
        self._mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
        self._mark.restype = ctypes.c_int

    def init(self, klass: int) -> int:
        """A new fanotify group of class ``klass``, non-blocking, close-on-exec; returns its fd."""
        fd = int(self._init(klass | FAN_CLOEXEC | FAN_NONBLOCK, os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC))
        if fd < 0:
            err = ctypes.get_errno()
            raise FanotifyError(err, f"fanotify_init: {os.strerror(err)}")
        return fd

    def mark(self, group_fd: int, flags: int, mask: int, path: str | None) -> None:
        """Add, remove or flush marks; ``path`` ``None`` for a flush."""
        encoded = None if path is None else os.fsencode(path)
        if self._mark(group_fd, flags, mask, -100, encoded) < 0:  # -100: AT_FDCWD
            err = ctypes.get_errno()
            raise FanotifyError(err, f"fanotify_mark {path}: {os.strerror(err)}")
