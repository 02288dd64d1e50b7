"""The node's GPUs as the node-side services see them: inventory, health events, the backend port.

These types live in ``services`` (not in the NVML adapter) because imports point downwards: the
node agent and the allocation mapper use them, and the NVML/fake adapters implement the port.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from gpupool.core.model import GpuCard, Topology
from gpupool.nodeagent.monitor.usage_sampling import UsageSample


@dataclass(frozen=True)
class GpuInventory:
    """The cards of this machine, their link levels, their device nodes (``/dev/nvidiaN``), their
    PCI addresses as NVML writes them (``00000000:3B:00.0``; empty when not known) and, per card,
    the further device nodes a container of it needs (a MIG device's access capabilities,
    ``/dev/nvidia-caps/nvidia-capN``; empty for a physical card or when not known)."""

    cards: tuple[GpuCard, ...]
    topology: Topology
    device_paths: tuple[str, ...]
    pci_bus_ids: tuple[str, ...] = ()
    access_paths: tuple[tuple[str, ...], ...] = ()

    def access_devices(self, index: int) -> tuple[str, ...]:
        """The further device nodes of the card with index ``index`` (none when not known)."""
        for card, paths in zip(self.cards, self.access_paths, strict=False):
            if card.index == index:
                return paths
        return ()

    def pci_bus_id(self, index: int) -> str:
        """NVML's PCI bus id of the card with index ``index``; ``""`` when not known."""
        for card, bus_id in zip(self.cards, self.pci_bus_ids, strict=False):
            if card.index == index:
                return bus_id
        return ""

    def card(self, index: int) -> GpuCard:
        """The card with NVML index ``index``; ``KeyError`` when the machine has none."""
        for card in self.cards:
            if card.index == index:
                return card
        raise KeyError(f"no GPU with index {index} on this node")

    def device_path(self, index: int) -> str:
        """Host path of the card's device node."""
        for card, path in zip(self.cards, self.device_paths, strict=True):
            if card.index == index:
                return path
        raise KeyError(f"no GPU with index {index} on this node")

    @property
    def model(self) -> str:
        """The node's GPU model (the most common one when a node mixes models)."""
        if not self.cards:
            return ""
        models = [c.model for c in self.cards]
        return max(sorted(set(models)), key=models.count)


@dataclass(frozen=True)
class HealthEvent:
    """A card became unhealthy (XID, lost) or recovered; ``reason`` is for logs and events."""

    card: int
    healthy: bool
    reason: str


class GpuBackend(Protocol):
    """Discovery and health watching of this machine's GPUs."""

    def inventory(self) -> GpuInventory:
        """The cards as they are now (health included)."""
        ...

    def health_events(self) -> AsyncIterator[HealthEvent]:
        """Health changes as they happen; runs until cancelled."""
        ...

    def sample_usage(self) -> UsageSample:
        """Per card utilisation and memory, per process memory and SM share, now (the usage
        monitor's sampler). Blocking; a card that cannot be read is left out of the sample (the
        idle rule then counts it as active), an error for the whole node raises."""
        ...

    def close(self) -> None:
        """Release the library (NVML shutdown); idempotent."""
        ...
