"""What the node side needs to know about its GPUs, independent of how it is found out.

The device plugin and the node agent only talk to :class:`GpuBackend`; the real implementation
asks NVML, the fake one reads a YAML file, so the whole node side (and its tests) runs on machines
without GPUs.
"""

from __future__ import annotations

from gpupool.nodeagent.gpu_inventory import GpuBackend, GpuInventory, HealthEvent

__all__ = ["APPLICATION_XIDS", "CONTROL_DEVICES", "GpuBackend", "GpuInventory", "HealthEvent",
           "xid_is_critical"]

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs caused by the application (illegal address, page fault, ...), not by the card. The NVIDIA
device plugin ignores the same set; every other XID marks the card unhealthy."""

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
"""Device nodes every GPU container needs besides its own ``/dev/nvidiaN``."""


def xid_is_critical(xid: int) -> bool:
    """Whether an XID means the card itself is broken (rather than the program on it)."""
    return xid not in APPLICATION_XIDS
