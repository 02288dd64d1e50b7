"""Read a container's ``memory.region`` (the layout of ``src/region.h``, version 1) without locking.

The node agent and the tests use this to see what a container's processes hold and which limits
they run under. A snapshot taken without the region's lock may be a moment stale or mix two
updates; it is for reporting, never for admission.
"""

from __future__ import annotations

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
        devices.append(DeviceState(used, limit, percent, MODES[mode] if mode < len(MODES) else str(mode),
                                   util_container, util_others, target, overflow))
    processes = []
    for index in range(slot_count):
        pid, host_pid, start, *used = SLOT.unpack_from(data, SLOTS_OFFSET + index * SLOT.size)
        if pid:
            processes.append(ProcessSlot(pid, start, tuple(used), host_pid))
    return RegionSnapshot(tuple(devices), tuple(processes))


def read_region(path: Path) -> RegionSnapshot:
    """Read and decode a region file."""
    return parse_region(path.read_bytes())
