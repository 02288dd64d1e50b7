"""The NVML backend for real GPUs (``nvidia-ml-py``; ``pynvml`` is imported lazily).

Lazy import: the package must import, and the fake backend must run, on machines without the NVIDIA
driver. Health follows the NVIDIA device plugin: XID critical-error events mark a card unhealthy
unless the XID is an application error; a card whose handle stops answering is lost. A card in MIG
mode is published as its MIG devices (virtual cards, :mod:`gpupool.nodeagent.nvml.mig`); MIG mode
is only read here, never changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

from gpupool.core.model import GpuCard, GpuKind, LinkLevel, Topology
from gpupool.nodeagent.monitor.usage_sampling import UsageSample
from gpupool.nodeagent.nvml.backend import GpuInventory, HealthEvent, xid_is_critical
from gpupool.nodeagent.nvml.mig import MigDevice, access_devices, read_mig
from gpupool.nodeagent.nvml.usage import NvmlUsageSampler

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class _Published:
    """One published card: its NVML handle (a MIG device's for a virtual card) and the index of the
    physical card it lives on (health is watched per physical card)."""

    handle: Any
    physical: int


class NvmlBackend:
    """Reads cards, MIG devices, memory, topology and XID events from NVML.

    A card in MIG mode is published as its MIG devices, each a virtual card (:mod:`.mig`); card
    indices are positions in the published list, physical cards and MIG devices in NVML order.
    """

    def __init__(self, poll_interval_s: float = 5.0, proc_root: str = "/proc",
                 device_exists: Callable[[str], bool] = os.path.exists) -> None:
        self._nvml = _load()
        self._proc_root = proc_root
        self._device_exists = device_exists
        self._poll = poll_interval_s
        self._unhealthy: dict[int, str] = {}
        self._published: list[_Published] | None = None
        self._warned: set[str] = set()
        self._usage = NvmlUsageSampler(self._nvml, self._card_handles)

    def _handles(self) -> list[Any]:
        n = self._nvml
        return [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]

    def _card_handles(self) -> list[Any]:
        """The handles of the published cards, by card index (MIG devices' own handles)."""
        if self._published is None:
            self.inventory()
        return [p.handle for p in self._published or []]

    def inventory(self) -> GpuInventory:
        """Cards with UUID, model, memory, minor number, pairwise link level and health; a card in
        MIG mode as its MIG devices (virtual cards, on the parent's device node and PCI address,
        with their capability device nodes where the driver has them)."""
        n = self._nvml
        handles = self._handles()
        cards: list[GpuCard] = []
        paths: list[str] = []
        buses: list[str] = []
        access: list[tuple[str, ...]] = []
        published: list[_Published] = []
        for i, h in enumerate(handles):
            memory = n.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            uuid = _text(n.nvmlDeviceGetUUID(h))
            model = _text(n.nvmlDeviceGetName(h)).replace(" ", "-")
            minor = int(n.nvmlDeviceGetMinorNumber(h))
            path, bus = f"/dev/nvidia{minor}", self._pci_bus_id(h)
            mig = read_mig(n, h)
            self._warn(uuid, mig.warning)
            if not mig.enabled:
                cards.append(GpuCard(index=len(cards), uuid=uuid, model=model, memory_mib=int(memory),
                                     healthy=len(cards) not in self._unhealthy))
                paths.append(path)
                buses.append(bus)
                access.append(())
                published.append(_Published(h, i))
                continue
            for device in mig.devices:
                cards.append(GpuCard(index=len(cards), uuid=device.uuid, model=model,
                                     memory_mib=device.memory_mib, compute=device.compute(mig.slices),
                                     kind=GpuKind.VIRTUAL, healthy=len(cards) not in self._unhealthy,
                                     profile=device.profile, parent=uuid))
                paths.append(path)
                buses.append(bus)
                access.append(self._access(minor, device))
                published.append(_Published(device.handle, i))
        self._published = published
        topology = Topology(tuple(tuple(row) for row in self._levels(handles, published)))
        return GpuInventory(cards=tuple(cards), topology=topology, device_paths=tuple(paths),
                            pci_bus_ids=tuple(buses), access_paths=tuple(access))

    def _levels(self, handles: list[Any], published: list[_Published]) -> list[list[LinkLevel]]:
        """Link levels between published cards: those of their physical cards; two MIG devices of
        one card share its board (NVLink level, the nearest there is short of the same device)."""
        between = {(a, b): self._link(ha, hb) for a, ha in enumerate(handles)
                   for b, hb in enumerate(handles) if a != b}
        return [[LinkLevel.SELF if x == y else LinkLevel.NVLINK if p.physical == q.physical
                 else between[(p.physical, q.physical)] for y, q in enumerate(published)]
                for x, p in enumerate(published)]

    def _link(self, ha: Any, hb: Any) -> LinkLevel:
        n = self._nvml
        level = _NVML_LEVELS.get(int(n.nvmlDeviceGetTopologyCommonAncestor(ha, hb)), LinkLevel.SYSTEM)
        try:
            if n.nvmlDeviceGetP2PStatus(ha, hb, n.NVML_P2P_CAPS_INDEX_NVLINK) == n.NVML_P2P_STATUS_OK:
                level = LinkLevel.NVLINK
        except Exception:  # older drivers lack the call; PCIe levels stand
            pass
        return level

    def _access(self, minor: int, device: MigDevice) -> tuple[str, ...]:
        """The MIG device's capability nodes when all exist on the host (a grant naming a missing
        node would stop the container from starting; the runtime then adds them itself)."""
        paths = access_devices(self._proc_root, minor, device)
        return paths if all(self._device_exists(p) for p in paths) else ()

    def _warn(self, uuid: str, warning: str) -> None:
        """Log a card's MIG warning once (the inventory is read again at every publication)."""
        if warning and f"{uuid}: {warning}" not in self._warned:
            self._warned.add(f"{uuid}: {warning}")
            log.warning("GPU %s: %s", uuid, warning)

    def _cards_on(self, physical: int) -> list[int]:
        """The published card indices that live on physical card ``physical``."""
        if self._published is None:
            self.inventory()
        return [i for i, p in enumerate(self._published or []) if p.physical == physical]

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
                physical = uuid_to_index.get(_text(n.nvmlDeviceGetUUID(data.device)), -1)
                xid = int(data.eventData)
                if physical >= 0 and xid_is_critical(xid):
                    # an XID on a card in MIG mode stops all of its MIG devices
                    for index in self._cards_on(physical):
                        if index not in self._unhealthy:
                            self._unhealthy[index] = f"XID {xid}"
                            yield HealthEvent(index, False, f"XID {xid}")
            for i, h in enumerate(handles):
                try:
                    n.nvmlDeviceGetMemoryInfo(h)
                except Exception as exc:
                    for index in self._cards_on(i):
                        if index not in self._unhealthy:
                            self._unhealthy[index] = f"lost: {exc}"
                            yield HealthEvent(index, False, f"GPU lost: {exc}")

    def _wait(self, event_set: Any) -> Any:
        try:
            return self._nvml.nvmlEventSetWait(event_set, int(self._poll * 1000))
        except Exception:  # NVML_ERROR_TIMEOUT: nothing happened
            return None

    def close(self) -> None:
        """Shut NVML down."""
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
