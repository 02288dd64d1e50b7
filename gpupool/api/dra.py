"""The DRA contract of gpupool's GPUs: the driver's name, how its devices are named, the capacities
and attributes each device carries.

The node agent publishes devices under these names (ResourceSlices) and reads claims allocated
from them; the extender reads the same claims to book them (issue 24). Defined once, here.
"""

from __future__ import annotations

from gpupool.api.names import DEFAULT_DOMAIN

#: Capacity names (the driver's own domain is implied, as the API allows).
MEMORY = "memory"
"""Card memory, in bytes; consumed in steps of 256 MiB."""
COMPUTE = "compute"
"""Compute, in percent of one card; consumed in steps of 1."""
COMPUTE_PERCENT = 100

#: Attribute names.
ATTR_MODEL = "model"
ATTR_UUID = "uuid"
ATTR_INDEX = "index"
ATTR_KIND = "kind"
"""``physical`` or ``virtual`` (a MIG device), on every device so that a selector may always read it."""
ATTR_PROFILE = "profile"
"""A MIG device's profile (``3g.40gb``); virtual devices only."""
ATTR_PARENT = "parent"
"""A MIG device's card's UUID; virtual devices only."""
#: The attribute Kubernetes standardises for a device's PCI address.
ATTR_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"

DEVICE_PREFIX = "gpu-"
MIB = 1 << 20


def driver_name(domain: str = DEFAULT_DOMAIN) -> str:
    """The DRA driver name of gpupool's GPUs under ``domain``: ``gpu.gpupool.io`` by default (a
    DNS subdomain, as ResourceSlices and DeviceClass selectors need)."""
    return f"gpu.{domain}"


def device_name(index: int) -> str:
    """A card's device name in its node's slice: ``gpu-<NVML index>``."""
    return f"{DEVICE_PREFIX}{index}"


def card_of(device: str) -> int:
    """The NVML index a device name stands for; ``ValueError`` for a name gpupool never publishes."""
    digits = device.removeprefix(DEVICE_PREFIX)
    if not device.startswith(DEVICE_PREFIX) or not digits.isdigit() or len(digits) > 6:
        raise ValueError(f"device {device!r} is not one of gpupool's (expected {DEVICE_PREFIX}<index>)")
    return int(digits)
