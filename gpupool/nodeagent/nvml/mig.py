"""MIG instances of one physical card, read from NVML (never changed: gpupool does not set MIG mode).

A card in MIG mode runs CUDA only inside its MIG devices (a GPU instance with a compute instance);
the node publishes each of them as a virtual card (:mod:`gpupool.nodeagent.nvml.real`). Calls, all
read-only: ``nvmlDeviceGetMigMode`` (current mode first), ``nvmlDeviceGetMaxMigDeviceCount``,
``nvmlDeviceGetMigDeviceHandleByIndex`` (``NOT_FOUND`` for an empty slot),
``nvmlDeviceGetGpuInstanceId`` / ``nvmlDeviceGetComputeInstanceId``, ``nvmlDeviceGetAttributes``
(slice counts, memory), ``nvmlDeviceGetUUID`` and ``nvmlDeviceGetName`` on each MIG device, and
``nvmlDeviceGetGpuInstanceProfileInfo`` on the parent for its number of slices.

The compute rule: a MIG device gets ``compute slices * 1000 // the parent's slices`` per-mille of a
card (3/7 of an A100, H100 or H200 for ``3g.40gb``: 428), its memory is its own. Errors: a card that
does not support MIG (``NOT_SUPPORTED``, or a driver without the call) is simply not in MIG mode;
any other failing query makes the card a physical card again with a warning, so one odd driver
answer never stops the agent.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMPUTE_PER_CARD = 1000
"""Per-mille of one card: the core's compute unit (:data:`gpupool.core.units.COMPUTE_PER_CARD`)."""

DEFAULT_SLICES = 7
"""The parent's slice count when NVML names none of its full-card profiles: A100, H100 and H200
cut a card into 7 compute slices."""

_FULL_PROFILES = ("NVML_GPU_INSTANCE_PROFILE_8_SLICE", "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
                  "NVML_GPU_INSTANCE_PROFILE_6_SLICE", "NVML_GPU_INSTANCE_PROFILE_4_SLICE")
"""The largest GPU-instance profiles, asked in turn for the parent's number of slices."""

_PROFILE_IN_NAME = re.compile(r"\bMIG\s+(\S+)\s*$")
"""The driver names a MIG device ``<parent name> MIG <profile>`` (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``)."""

MIB = 1024 * 1024

CAPS_DEVICE_DIR = "/dev/nvidia-caps"
"""Where the driver's capability device nodes live (``nvidia-cap<minor>``)."""

_DEVICE_MINOR = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance inside a GPU instance) as NVML reports it."""

    handle: Any
    uuid: str
    memory_mib: int
    gpu_instance: int
    compute_instance: int
    gpu_slices: int
    compute_slices: int
    profile: str

    def compute(self, parent_slices: int) -> int:
        """Its compute in per-mille of the whole card: its compute slices over the card's."""
        return min(COMPUTE_PER_CARD, self.compute_slices * COMPUTE_PER_CARD // max(1, parent_slices))


@dataclass(frozen=True)
class MigState:
    """A card's MIG view: ``enabled`` with its devices and slice count, or not (``warning`` says why
    a card in MIG mode, or one whose mode could not be read, is treated as physical)."""

    enabled: bool
    devices: tuple[MigDevice, ...] = ()
    slices: int = DEFAULT_SLICES
    warning: str = ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error_code(exc: Exception) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def read_mig(nvml: Any, parent: Any) -> MigState:
    """The MIG devices of the card ``parent`` (an NVML device handle); never raises."""
    try:
        current = nvml.nvmlDeviceGetMigMode(parent)[0]
    except Exception as exc:
        if _error_code(exc) in (getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
                                getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)):
            return MigState(enabled=False)  # a card, or a driver, from before MIG
        return MigState(enabled=False, warning=f"MIG mode could not be read ({exc}); published as a physical card")
    if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return MigState(enabled=False)
    try:
        slices = _parent_slices(nvml, parent)
        devices = tuple(_devices(nvml, parent, slices))
    except Exception as exc:
        return MigState(enabled=False, warning=f"MIG is on but its devices could not be read ({exc}); "
                                               "published as a physical card")
    empty = "" if devices else "MIG is on but no MIG device exists: the card offers nothing until one is created"
    return MigState(enabled=True, devices=devices, slices=slices, warning=empty)


def _parent_slices(nvml: Any, parent: Any) -> int:
    for name in _FULL_PROFILES:
        profile = getattr(nvml, name, None)
        if profile is None:
            continue
        try:
            count = int(nvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, profile).sliceCount)
        except Exception:  # the card does not offer this profile: try the next
            continue
        if count > 0:
            return count
    return DEFAULT_SLICES


def _devices(nvml: Any, parent: Any, slices: int) -> list[MigDevice]:
    parent_memory = int(nvml.nvmlDeviceGetMemoryInfo(parent).total) // MIB
    found = []
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(parent))):
        try:
            handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
        except Exception as exc:
            if _error_code(exc) == getattr(nvml, "NVML_ERROR_NOT_FOUND", 6):
                continue  # an empty slot: no MIG device was created there
            raise
        attributes = nvml.nvmlDeviceGetAttributes(handle)
        gpu_slices, compute_slices = int(attributes.gpuInstanceSliceCount), int(attributes.computeInstanceSliceCount)
        memory = int(attributes.memorySizeMB)
        name = _text(nvml.nvmlDeviceGetName(handle))
        found.append(MigDevice(
            handle=handle, uuid=_text(nvml.nvmlDeviceGetUUID(handle)), memory_mib=memory,
            gpu_instance=int(nvml.nvmlDeviceGetGpuInstanceId(handle)),
            compute_instance=int(nvml.nvmlDeviceGetComputeInstanceId(handle)),
            gpu_slices=gpu_slices, compute_slices=compute_slices,
            profile=profile_name(name, gpu_slices, compute_slices, memory, parent_memory)))
    return found


def profile_name(device_name: str, gpu_slices: int, compute_slices: int, memory_mib: int,
                 parent_memory_mib: int) -> str:
    """The profile as ``nvidia-smi`` names it: from the device's name when the driver put it there,
    otherwise ``<g>g.<GB>gb`` (``<c>c.<g>g.<GB>gb`` for a compute instance smaller than its GPU
    instance), the memory rounded up to an eighth of the card as the driver's names are."""
    named = _PROFILE_IN_NAME.search(device_name)
    if named:
        return named.group(1)
    if parent_memory_mib > 0:
        eighths = math.ceil(memory_mib * 8 / parent_memory_mib)
        gigabytes = round(eighths * parent_memory_mib / 8 / 1024)
    else:
        gigabytes = math.ceil(memory_mib / 1024)
    prefix = f"{compute_slices}c." if compute_slices != gpu_slices else ""
    return f"{prefix}{gpu_slices}g.{gigabytes}gb"


def access_devices(proc_root: str, card_minor: int, device: MigDevice) -> tuple[str, ...]:
    """The capability device nodes a process needs to use ``device`` (its GPU instance's and its
    compute instance's), read from the driver's ``capabilities/gpu<minor>/mig/gi<g>[/ci<c>]/access``
    files under ``proc_root`` (``/proc``). Empty when the driver has none (capabilities kept in
    ``/proc`` rather than as device files) or a file cannot be read: the container runtime then
    adds what it needs, and no wrong node is ever granted."""
    base = Path(proc_root, "driver/nvidia/capabilities", f"gpu{card_minor}", "mig", f"gi{device.gpu_instance}")
    found = []
    for access in (base / "access", base / f"ci{device.compute_instance}" / "access"):
        try:
            minor = _DEVICE_MINOR.search(access.read_text(encoding="ascii", errors="replace"))
        except OSError:
            return ()
        if minor is None:
            return ()
        found.append(f"{CAPS_DEVICE_DIR}/nvidia-cap{int(minor.group(1))}")
    return tuple(found)
