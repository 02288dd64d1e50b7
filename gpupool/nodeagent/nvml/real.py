"""The NVML backend for real GPUs (``nvidia-ml-py``; ``pynvml`` is imported lazily).

Lazy import: the package must import, and the fake backend must run, on machines without the NVIDIA
driver. Health follows the NVIDIA device plugin: XID critical-error events mark a card unhealthy
unless the XID is an application error; a card whose handle stops answering is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any, cast

from gpupool.core.model import GpuCard, LinkLevel, Topology
from gpupool.nodeagent.monitor.usage_sampling import UsageSample
from gpupool.nodeagent.nvml.backend import GpuInventory, HealthEvent, xid_is_critical
from gpupool.nodeagent.nvml.usage import NvmlUsageSampler

_NVML_LEVELS = {0: LinkLevel.SELF, 10: LinkLevel.PCIE_SWITCH, 20: LinkLevel.MULTI_SWITCH,
                30: LinkLevel.HOST_BRIDGE, 40: LinkLevel.NUMA_NODE, 50: LinkLevel.SYSTEM}
"""NVML_TOPOLOGY_{INTERNAL,SINGLE,MULTIPLE,HOSTBRIDGE,NODE,SYSTEM} → core link levels."""


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be loaded or initialised (no driver); use ``--fake-gpus`` on such machines."""


def _load() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise NvmlUnavailableError("nvidia-ml-py is not installed") from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        raise NvmlUnavailableError(f"NVML did not initialise: {exc}") from exc
    return cast(ModuleType, pynvml)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """Reads cards, memory, topology and XID events from NVML."""

    def __init__(self, poll_interval_s: float = 5.0) -> None:
        self._nvml = _load()
        self._poll = poll_interval_s
        self._unhealthy: dict[int, str] = {}
        self._usage = NvmlUsageSampler(self._nvml, self._handles)

    def _handles(self) -> list[Any]:
        n = self._nvml
        return [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]

    def inventory(self) -> GpuInventory:
        """Cards with UUID, model, memory, minor number, pairwise link level and health."""
        n = self._nvml
        handles = self._handles()
        cards, paths, buses = [], [], []
        for i, h in enumerate(handles):
            memory = n.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            cards.append(GpuCard(index=i, uuid=_text(n.nvmlDeviceGetUUID(h)),
                                 model=_text(n.nvmlDeviceGetName(h)).replace(" ", "-"),
                                 memory_mib=int(memory), healthy=i not in self._unhealthy))
            paths.append(f"/dev/nvidia{n.nvmlDeviceGetMinorNumber(h)}")
            buses.append(self._pci_bus_id(h))
        levels = [[LinkLevel.SELF] * len(handles) for _ in handles]
        for a, ha in enumerate(handles):
            for b, hb in enumerate(handles):
                if a == b:
                    continue
                level = _NVML_LEVELS.get(int(n.nvmlDeviceGetTopologyCommonAncestor(ha, hb)),
                                         LinkLevel.SYSTEM)
                try:
                    nvlink = n.nvmlDeviceGetP2PStatus(ha, hb, n.NVML_P2P_CAPS_INDEX_NVLINK)
                    if nvlink == n.NVML_P2P_STATUS_OK:
                        level = LinkLevel.NVLINK
                except Exception:  # older drivers lack the call; PCIe levels stand
                    pass
                levels[a][b] = level
        topology = Topology(tuple(tuple(row) for row in levels))
        return GpuInventory(cards=tuple(cards), topology=topology, device_paths=tuple(paths),
                            pci_bus_ids=tuple(buses))

    def _pci_bus_id(self, handle: Any) -> str:
        """``00000000:3B:00.0``; ``""`` when the driver does not answer (the card's dmem region,
        which is named by it, is then not looked for)."""
        try:
            return _text(self._nvml.nvmlDeviceGetPciInfo(handle).busId)
        except Exception:
            return ""

    def sample_usage(self) -> UsageSample:
        """Utilisation, memory and processes of every card that answers (:mod:`.usage`)."""
        return self._usage.sample()

    async def health_events(self) -> AsyncIterator[HealthEvent]:
        """XID events from an NVML event set (waited on in a thread) and a lost-card poll."""
        n = self._nvml
        event_set = n.nvmlEventSetCreate()
        handles = self._handles()
        for h in handles:
            # A card without event support is only polled for loss.
            with contextlib.suppress(Exception):
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, event_set)
        uuid_to_index = {_text(n.nvmlDeviceGetUUID(h)): i for i, h in enumerate(handles)}
        while True:
            data = await asyncio.to_thread(self._wait, event_set)
            if data is not None:
                index = uuid_to_index.get(_text(n.nvmlDeviceGetUUID(data.device)), -1)
                xid = int(data.eventData)
                if index >= 0 and xid_is_critical(xid) and index not in self._unhealthy:
                    self._unhealthy[index] = f"XID {xid}"
                    yield HealthEvent(index, False, f"XID {xid}")
            for i, h in enumerate(handles):
                try:
                    n.nvmlDeviceGetMemoryInfo(h)
                except Exception as exc:
                    if i not in self._unhealthy:
                        self._unhealthy[i] = f"lost: {exc}"
                        yield HealthEvent(i, False, f"GPU lost: {exc}")

    def _wait(self, event_set: Any) -> Any:
        try:
            return self._nvml.nvmlEventSetWait(event_set, int(self._poll * 1000))
        except Exception:  # NVML_ERROR_TIMEOUT: nothing happened
            return None

    def close(self) -> None:
        """Shut NVML down."""
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
