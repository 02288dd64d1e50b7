"""Read a container's ``memory.region`` (the layout of ``src/region.h``, version 1) without locking,
and write the two fields the node agent may set in it.

The node agent and the tests use this to see what a container's processes hold and which limits
they run under. A snapshot taken without the region's lock may be a moment stale or mix two
updates; it is for reporting, never for admission.

Writes are single aligned 8-byte stores into the shared mapping (what the library reads with atomic
loads): :func:`freeze_memory` lowers a card's memory limit to what the container holds (the library
takes the lower of the region's limit and its own, so a write can only narrow it) and
:func:`set_wait` sets how long an allocation the driver refuses for want of room is retried.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0x52535047
VERSION = 1
MAX_DEVICES = 16
SLOTS = 256
HEADER = struct.Struct("<6I")  # magic, version, size, device_count, slot_count, reserved
DEVICES_OFFSET = 128  # after the header (64 bytes) and the lock (64 bytes)
DEVICE = struct.Struct("<QQII40x" "qQQQQQQIIII24x")  # memory fields, then the compute bucket
OVERFLOW = struct.Struct("<Q")  # at 24 into a device record: the part of `used` of processes without a slot
OVERFLOW_OFFSET = 24
USED_OFFSET, MEMORY_LIMIT_OFFSET, WAIT_OFFSET = 0, 8, 32  # in a device record
WAIT = struct.Struct("<Q")  # at 32: the agent's bound (ns) on retrying an allocation refused for want of room
SLOT = struct.Struct("<iiQ16Q")
SLOTS_OFFSET = DEVICES_OFFSET + MAX_DEVICES * DEVICE.size
SIZE = SLOTS_OFFSET + SLOTS * SLOT.size
MODES = ("hard", "soft")


class RegionFormatError(ValueError):
    """The file is not a version-1 region (wrong magic, version or size)."""


@dataclass(frozen=True)
class DeviceState:
    """One card as the container's processes see it."""

    used_bytes: int
    memory_limit_bytes: int  # 0: none
    compute_percent: int  # 0: none
    compute_mode: str
    util_container_percent: int  # last measured by the compute controller
    util_others_percent: int
    target_percent: int
    overflow_bytes: int = 0  # part of used_bytes charged by processes that found no free slot
    wait_ns: int = 0  # the agent's bound on retrying an allocation the driver refuses (the card is lent)


@dataclass(frozen=True)
class ProcessSlot:
    """A process of the container that used the library, and what it holds per card."""

    pid: int
    start_time: int  # /proc/<pid>/stat field 22
    used_bytes: tuple[int, ...]
    host_pid: int = 0  # the pid the agent saw it register with (NVML's); 0: not known


@dataclass(frozen=True)
class RegionSnapshot:
    """The whole region: every card and every live slot."""

    devices: tuple[DeviceState, ...]
    processes: tuple[ProcessSlot, ...]


def parse_region(data: bytes) -> RegionSnapshot:
    """Decode the bytes of a region file."""
    if len(data) < HEADER.size:
        raise RegionFormatError(f"a version-{VERSION} region has {SIZE} bytes, this one {len(data)}")
    magic, version, size, device_count, slot_count, _ = HEADER.unpack_from(data, 0)
    # A library compiled for tests with a smaller slot table (SHIM_REGION_SLOTS) writes its count.
    expected = SLOTS_OFFSET + slot_count * SLOT.size
    if magic != MAGIC or version != VERSION or size != len(data) or device_count != MAX_DEVICES or \
            size != expected or not 0 < slot_count <= SLOTS:
        raise RegionFormatError(f"not a version-{VERSION} region (magic {magic:#x}, version {version})")
    devices = []
    for index in range(MAX_DEVICES):
        fields = DEVICE.unpack_from(data, DEVICES_OFFSET + index * DEVICE.size)
        used, limit, percent, mode = fields[0:4]
        util_container, util_others, target = fields[11:14]
        (overflow,) = OVERFLOW.unpack_from(data, DEVICES_OFFSET + index * DEVICE.size + OVERFLOW_OFFSET)
        (wait_ns,) = WAIT.unpack_from(data, DEVICES_OFFSET + index * DEVICE.size + WAIT_OFFSET)
        devices.append(DeviceState(used, limit, percent, MODES[mode] if mode < len(MODES) else str(mode),
                                   util_container, util_others, target, overflow, wait_ns))
    processes = []
    for index in range(slot_count):
        pid, host_pid, start, *used = SLOT.unpack_from(data, SLOTS_OFFSET + index * SLOT.size)
        if pid:
            processes.append(ProcessSlot(pid, start, tuple(used), host_pid))
    return RegionSnapshot(tuple(devices), tuple(processes))


def read_region(path: Path) -> RegionSnapshot:
    """Read and decode a region file."""
    return parse_region(path.read_bytes())


def _device_word(region: mmap.mmap, ordinal: int, offset: int) -> ctypes.c_uint64:
    if not 0 <= ordinal < MAX_DEVICES:
        raise RegionFormatError(f"card ordinal {ordinal} is not in a region (0..{MAX_DEVICES - 1})")
    return ctypes.c_uint64.from_buffer(region, DEVICES_OFFSET + ordinal * DEVICE.size + offset)


def _mapped(path: Path) -> tuple[int, mmap.mmap]:
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        region = mmap.mmap(fd, 0)
    except (OSError, ValueError):
        os.close(fd)
        raise
    if (length := len(region)) < HEADER.size:  # a short file: unpacking would raise struct.error
        region.close()
        os.close(fd)
        raise RegionFormatError(f"{path} is not a version-{VERSION} region ({length} bytes)")
    magic, version, size, device_count, slot_count, _ = HEADER.unpack_from(region, 0)
    if magic != MAGIC or version != VERSION or size != len(region) or device_count != MAX_DEVICES or \
            size != SLOTS_OFFSET + slot_count * SLOT.size:
        region.close()
        os.close(fd)
        raise RegionFormatError(f"{path} is not a version-{VERSION} region (magic {magic:#x}, version {version})")
    return fd, region


def freeze_memory(path: Path, ordinal: int) -> int:
    """Lower card ``ordinal``'s memory limit to what the container holds now (at least one byte: 0 would
    mean no limit), so that its processes allocate nothing more; an existing lower limit stays. Returns
    the limit in force. An allocation racing the write may still land once (the library checks
    ``used <= limit``, so nothing after it does)."""
    fd, region = _mapped(path)
    try:
        used = _device_word(region, ordinal, USED_OFFSET)
        limit = _device_word(region, ordinal, MEMORY_LIMIT_OFFSET)
        frozen = max(used.value, 1)
        if limit.value == 0 or frozen < limit.value:
            limit.value = frozen
        value = limit.value
        del used, limit  # the buffer exports end before the mapping closes
        return value
    finally:
        region.close()
        os.close(fd)


def set_wait(path: Path, ordinal: int, wait_ns: int) -> None:
    """Set how long the container's allocations on card ``ordinal`` that the driver refuses for want of
    room are retried (0: not at all). Also into a region no process initialised yet (the zero-filled
    file the agent creates at Allocate): under the file lock the library initialises a region with,
    which keeps the bound (``map_file`` in ``src/region.c``), so a container's first allocation
    already waits."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when the descriptor closes
        try:
            region = mmap.mmap(fd, 0)
        except ValueError:  # an empty file
            raise RegionFormatError(f"{path} is empty") from None
        with region:
            if len(region) == SIZE and not any(region[:HEADER.size]):  # not initialised yet
                word = _device_word(region, ordinal, WAIT_OFFSET)
                word.value = max(0, wait_ns)
                del word
                return
    finally:
        os.close(fd)
    fd, region = _mapped(path)
    try:
        word = _device_word(region, ordinal, WAIT_OFFSET)
        word.value = max(0, wait_ns)
        del word
    finally:
        region.close()
        os.close(fd)
