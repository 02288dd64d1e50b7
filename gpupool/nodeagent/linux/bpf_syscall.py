"""The bpf(2) system call through ctypes: maps, program load with the verifier's log, cgroup attach.

Only the commands the cgroup-device gate needs (see ``man 2 bpf`` and ``include/uapi/linux/bpf.h``).
Each command fills a zeroed ``union bpf_attr`` at the documented byte offsets; the kernel accepts a
shorter union than its own as long as it is the prefix, so one fixed size serves every command.
Every failure is a :class:`BpfError` carrying ``errno`` and, for a refused program, the verifier's
log, so that callers can say why.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass

BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_QUERY = 16
BPF_LINK_CREATE = 28

BPF_MAP_TYPE_HASH = 1
BPF_MAP_TYPE_PERF_EVENT_ARRAY = 4
BPF_MAP_TYPE_RINGBUF = 27

BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6  # attach type
BPF_F_ALLOW_MULTI = 1 << 1
BPF_ANY = 0

# The bpf syscall's number differs per architecture (asm/unistd.h).
_SYSCALL_NUMBERS = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}

ATTR_BYTES = 128
LOG_BYTES = 1 << 20
LOG_LEVEL_ON_FAILURE = 1
_NAME_BYTES = 16  # BPF_OBJ_NAME_LEN


class BpfError(OSError):
    """A bpf(2) command failed; ``verifier_log`` holds the verifier's reasons for a refused program."""

    def __init__(self, err: int, message: str, verifier_log: str = "") -> None:
        super().__init__(err, message)
        self.verifier_log = verifier_log


@dataclass(frozen=True)
class Attachment:
    """What ``BPF_PROG_QUERY`` reports for one attach point: its flags and the attached program IDs."""

    flags: int
    program_ids: tuple[int, ...]


class Bpf:
    """The bpf(2) commands as methods; file descriptors returned are the caller's to close."""

    def __init__(self) -> None:
        machine = platform.machine()
        if machine not in _SYSCALL_NUMBERS:
            raise BpfError(0, f"bpf(2) syscall number unknown for architecture {machine}")
        self._number = _SYSCALL_NUMBERS[machine]
        libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long

    def _call(self, cmd: int, attr: ctypes.Array[ctypes.c_char], what: str) -> int:
        result = int(self._syscall(ctypes.c_long(self._number), ctypes.c_int(cmd), attr,
                                   ctypes.c_uint(ATTR_BYTES)))
        if result < 0:
            err = ctypes.get_errno()
            raise BpfError(err, f"bpf({what}): {os.strerror(err)}")
        return result

    def map_create(self, map_type: int, key_size: int, value_size: int, max_entries: int,
                   name: str = "") -> int:
        """A new map; returns its fd."""
        attr = ctypes.create_string_buffer(ATTR_BYTES)
        struct.pack_into("=IIIII", attr, 0, map_type, key_size, value_size, max_entries, 0)
        struct.pack_into(f"={_NAME_BYTES}s", attr, 28, _name(name))
        return self._call(BPF_MAP_CREATE, attr, f"MAP_CREATE {name}")

    def map_update(self, map_fd: int, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        """Insert or replace ``key`` (sizes as the map was created with)."""
        key_buf, value_buf = ctypes.create_string_buffer(key, len(key)), ctypes.create_string_buffer(value, len(value))
        attr = _elem_attr(map_fd, key_buf, ctypes.addressof(value_buf), flags)
        self._call(BPF_MAP_UPDATE_ELEM, attr, "MAP_UPDATE_ELEM")

    def map_delete(self, map_fd: int, key: bytes) -> bool:
        """Remove ``key``; ``False`` when it was not there."""
        key_buf = ctypes.create_string_buffer(key, len(key))
        try:
            self._call(BPF_MAP_DELETE_ELEM, _elem_attr(map_fd, key_buf, 0, 0), "MAP_DELETE_ELEM")
        except BpfError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def map_lookup(self, map_fd: int, key: bytes, value_size: int) -> bytes | None:
        """The value at ``key``, ``None`` when absent."""
        key_buf, value_buf = ctypes.create_string_buffer(key, len(key)), ctypes.create_string_buffer(value_size)
        try:
            self._call(BPF_MAP_LOOKUP_ELEM, _elem_attr(map_fd, key_buf, ctypes.addressof(value_buf), 0),
                       "MAP_LOOKUP_ELEM")
        except BpfError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        return value_buf.raw

    def prog_load(self, prog_type: int, instructions: bytes, name: str = "", license_: str = "GPL",
                  expected_attach_type: int = 0) -> int:
        """Load a program; returns its fd. On refusal loads it again with the verifier's log on,
        so the error carries the reasons (the first try runs without a log: cheaper, and a log
        buffer too small would itself fail the load)."""
        try:
            return self._prog_load(prog_type, instructions, name, license_, expected_attach_type, 0)
        except BpfError as first:
            try:
                self._prog_load(prog_type, instructions, name, license_, expected_attach_type,
                                LOG_LEVEL_ON_FAILURE)
            except BpfError as second:
                raise BpfError(first.errno or 0, first.strerror or "", second.verifier_log) from None
            raise

    def _prog_load(self, prog_type: int, instructions: bytes, name: str, license_: str,
                   expected_attach_type: int, log_level: int) -> int:
        insns = ctypes.create_string_buffer(instructions, len(instructions))
        lic = ctypes.create_string_buffer(license_.encode())
        log_buf = ctypes.create_string_buffer(LOG_BYTES if log_level else 1)
        attr = ctypes.create_string_buffer(ATTR_BYTES)
        struct.pack_into("=IIQQIIQ", attr, 0, prog_type, len(instructions) // 8, ctypes.addressof(insns),
                         ctypes.addressof(lic), log_level, LOG_BYTES if log_level else 0,
                         ctypes.addressof(log_buf) if log_level else 0)
        struct.pack_into(f"={_NAME_BYTES}s", attr, 48, _name(name))
        struct.pack_into("=I", attr, 68, expected_attach_type)
        try:
            return self._call(BPF_PROG_LOAD, attr, f"PROG_LOAD {name}")
        except BpfError as exc:
            text = log_buf.value.decode(errors="replace").strip() if log_level else ""
            raise BpfError(exc.errno or 0, exc.strerror or "", text) from None

    def prog_attach(self, target_fd: int, prog_fd: int, attach_type: int, flags: int) -> None:
        """Attach ``prog_fd`` to the cgroup directory open as ``target_fd``."""
        attr = ctypes.create_string_buffer(ATTR_BYTES)
        struct.pack_into("=IIII", attr, 0, target_fd, prog_fd, attach_type, flags)
        self._call(BPF_PROG_ATTACH, attr, "PROG_ATTACH")

    def link_create(self, target_fd: int, prog_fd: int, attach_type: int) -> int:
        """Attach ``prog_fd`` to the cgroup ``target_fd`` through a BPF link; returns the link's fd.
        The program stays attached while the fd is open and is detached when the last copy closes
        (also when the process dies), unlike ``BPF_PROG_ATTACH``, which outlives its caller."""
        attr = ctypes.create_string_buffer(ATTR_BYTES)
        struct.pack_into("=IIII", attr, 0, prog_fd, target_fd, attach_type, 0)
        return self._call(BPF_LINK_CREATE, attr, "LINK_CREATE")

    def prog_detach(self, target_fd: int, prog_fd: int, attach_type: int) -> None:
        """Detach ``prog_fd`` (attached with ``BPF_F_ALLOW_MULTI``) from the cgroup ``target_fd``."""
        attr = ctypes.create_string_buffer(ATTR_BYTES)
        struct.pack_into("=III", attr, 0, target_fd, prog_fd, attach_type)
        self._call(BPF_PROG_DETACH, attr, "PROG_DETACH")

    def prog_query(self, target_fd: int, attach_type: int, max_programs: int = 64) -> Attachment:
        """The programs attached directly to the cgroup ``target_fd`` for ``attach_type``."""
        ids = (ctypes.c_uint32 * max_programs)()
        attr = ctypes.create_string_buffer(ATTR_BYTES)
        struct.pack_into("=IIIIQI", attr, 0, target_fd, attach_type, 0, 0, ctypes.addressof(ids), max_programs)
        self._call(BPF_PROG_QUERY, attr, "PROG_QUERY")
        flags, = struct.unpack_from("=I", attr, 12)
        count, = struct.unpack_from("=I", attr, 24)
        return Attachment(flags=flags, program_ids=tuple(ids[:count]))


def _name(name: str) -> bytes:
    """An object name as the kernel accepts it: at most 15 characters of ``[A-Za-z0-9_.]``."""
    kept = "".join(c if c.isalnum() or c in "_." else "_" for c in name)
    return kept.encode("ascii", errors="replace")[:_NAME_BYTES - 1]


def _elem_attr(map_fd: int, key: ctypes.Array[ctypes.c_char], value_address: int,
               flags: int) -> ctypes.Array[ctypes.c_char]:
    attr = ctypes.create_string_buffer(ATTR_BYTES)
    struct.pack_into("=IIQQQ", attr, 0, map_fd, 0, ctypes.addressof(key), value_address, flags)
    return attr
