"""Whether the kernel's device-memory cgroup controller (``dmem``) can limit GPU memory on this node.

``dmem`` (Linux 6.14 and later, ``CONFIG_CGROUP_DMEM``) charges device memory to cgroups through
regions that drivers register; ``dmem.capacity`` in the cgroup v2 root lists them, one
``<region> <bytes>`` per line, and ``dmem.max`` of a cgroup caps its use of each. It is usable for
GPU shares only when all of these hold, each checked here with the reason when it does not:

1. cgroup v2 at the cgroup root (a hybrid layout's ``unified`` mount has no controllers to give);
2. ``dmem`` among the root's ``cgroup.controllers`` (the kernel has the controller);
3. at least one region of an NVIDIA GPU in ``dmem.capacity`` (the driver registers its memory;
   NVIDIA documents ``nvidia/<pci address>/vidmem`` regions for drivers that serve MPS v3 memory
   partitioning). Regions of other drivers (``drm/...`` of amdgpu, xe) are reported but not counted.

A card's region is named by its PCI address in the kernel's form (``pci_name()``: 4-digit domain,
lower case, ``0000:3b:00.0``), which NVML writes as ``00000000:3B:00.0``. NVIDIA's driver names
it ``nvidia/<address>/vidmem``; the DRM drivers on TTM name their device memory
``drm/<address>/vram0`` (Documentation/admin-guide/cgroup-v2.rst, "DMEM"); both are looked for,
NVIDIA's first.

Detection only reads files; the root path is a parameter so tests use a directory tree.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

CGROUP_ROOT = "/sys/fs/cgroup"
NVIDIA_REGION_PREFIX = "nvidia/"
CARD_REGION_NAMES = ("nvidia/{address}/vidmem", "drm/{address}/vram0")
"""The region names a card's device memory may have, in the order they are looked for."""

_PCI_ADDRESS = re.compile(r"^([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")


class PciAddressError(ValueError):
    """Not a PCI address (``domain:bus:device.function``)."""


def kernel_pci_address(bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` (or the kernel's own form) → the kernel's ``0000:3b:00.0``."""
    found = _PCI_ADDRESS.match(bus_id.strip().lower())
    if found is None:
        raise PciAddressError(f"{bus_id!r} is not a PCI address like 00000000:3B:00.0")
    domain, bus, device, function = found.groups()
    if int(domain, 16) > 0xFFFF:
        raise PciAddressError(f"{bus_id!r}: PCI domain {domain} does not fit the kernel's 4 digits")
    return f"{int(domain, 16):04x}:{bus}:{device}.{function}"


@dataclass(frozen=True)
class DmemRegion:
    """One region of ``dmem.capacity``."""

    name: str
    capacity_bytes: int


@dataclass(frozen=True)
class DmemStatus:
    """Whether ``dmem`` can limit GPU memory here; the regions seen; why not when it cannot.

    ``controller``: the kernel offers ``dmem`` on a cgroup v2 root and lists its regions (limits
    can be written for any card whose region is listed); ``usable``: some region is an NVIDIA GPU's.
    """

    usable: bool
    reason: str
    regions: tuple[DmemRegion, ...] = ()
    controller: bool = False

    @property
    def gpu_regions(self) -> tuple[DmemRegion, ...]:
        return tuple(r for r in self.regions if r.name.startswith(NVIDIA_REGION_PREFIX))

    def card_region(self, bus_id: str) -> DmemRegion | None:
        """The region of the card at ``bus_id`` (NVML's PCI bus id), ``None`` when ``dmem.capacity``
        lists none for it; a malformed id raises :class:`PciAddressError`."""
        address = kernel_pci_address(bus_id)
        by_name = {r.name: r for r in self.regions}
        for pattern in CARD_REGION_NAMES:
            region = by_name.get(pattern.format(address=address))
            if region is not None:
                return region
        return None


def parse_capacity(text: str) -> tuple[DmemRegion, ...]:
    """``dmem.capacity`` lines; a line that is not ``<name> <bytes>`` is skipped."""
    regions = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            regions.append(DmemRegion(parts[0], int(parts[1])))
    return tuple(regions)


def detect_dmem(root: str = CGROUP_ROOT) -> DmemStatus:
    """What this node's cgroup root says about ``dmem``."""
    controllers_path = os.path.join(root, "cgroup.controllers")
    try:
        with open(controllers_path, encoding="utf-8") as fh:
            controllers = fh.read().split()
    except OSError:
        return DmemStatus(False, f"no cgroup v2 at {root} ({controllers_path} unreadable): dmem needs the "
                                 "unified hierarchy")
    if "dmem" not in controllers:
        return DmemStatus(False, "the kernel offers no dmem controller (Linux >= 6.14 with CONFIG_CGROUP_DMEM)")
    try:
        with open(os.path.join(root, "dmem.capacity"), encoding="utf-8") as fh:
            regions = parse_capacity(fh.read())
    except OSError as exc:
        return DmemStatus(False, f"dmem.capacity unreadable: {exc.strerror or exc}")
    status = DmemStatus(False, "", regions, controller=True)
    if not status.gpu_regions:
        others = ", ".join(r.name for r in regions) or "none"
        return DmemStatus(False, f"no NVIDIA region in dmem.capacity (regions: {others}); the GPU driver "
                                 "does not charge its memory to dmem", regions, controller=True)
    return DmemStatus(True, f"{len(status.gpu_regions)} NVIDIA regions", regions, controller=True)
