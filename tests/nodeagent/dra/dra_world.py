"""A node for the DRA tests: fake cards, claims in a dict, the plugin served on a temporary socket,
and the fake kubelet registered with it."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpupool.core.model import GpuCard, Topology
from gpupool.nodeagent.dra.claim_state import HeldElsewhere
from gpupool.nodeagent.dra.setup import DraDriver, DraOptions
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.testing.fake_dra_kubelet import ClaimName, FakeDraKubelet

NODE = "node-a"
DRIVER = "gpu.gpupool.io"
GIB = 1024


def inventory(cards: int = 2, memory_mib: int = 16 * GIB) -> GpuInventory:
    """``cards`` fake cards of ``memory_mib`` each, indices 0..n-1."""
    return GpuInventory(
        cards=tuple(GpuCard(i, f"GPU-{i:04d}", "NVIDIA-A100", memory_mib) for i in range(cards)),
        topology=Topology(), device_paths=tuple(f"/dev/nvidia{i}" for i in range(cards)),
        pci_bus_ids=tuple(f"00000000:{0x3B + i:02X}:00.0" for i in range(cards)))


def claim_object(name: str, uid: str, results: list[dict[str, Any]], *, namespace: str = "ns",
                 pod: str = "pod-a", pod_uid: str = "pod-uid-a") -> dict[str, Any]:
    """A ResourceClaim as the API serves it, allocated with ``results``."""
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid},
            "status": {"allocation": {"devices": {"results": results}},
                       "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}]}}


def result(device: str = "gpu-0", memory: str | None = "4Gi", compute: str | None = None, *,
           request: str = "gpu", pool: str = NODE, driver: str = DRIVER, share_id: str | None = "s1") -> dict[str, Any]:
    """One allocation result, with consumed capacity as the allocator records it."""
    consumed = {k: v for k, v in (("memory", memory), ("compute", compute)) if v is not None}
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if consumed:
        out["consumedCapacity"] = consumed
    if share_id:
        out["shareID"] = share_id
    return out


@dataclass
class ClaimStore:
    """Claims by (namespace, name), and how often each was read."""

    objects: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    reads: int = 0

    def add(self, obj: Mapping[str, Any]) -> ClaimName:
        meta = obj["metadata"]
        self.objects[(meta["namespace"], meta["name"])] = obj
        return ClaimName(meta["namespace"], meta["name"], meta["uid"])

    async def read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads += 1
        return self.objects.get((namespace, name))


@dataclass
class SliceDict:
    """Slices by name, with resource versions, as a store for the publisher."""

    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    writes: int = 0

    async def read_slice(self, name: str) -> Mapping[str, Any] | None:
        return self.slices.get(name)

    async def write_slice(self, body: Mapping[str, Any], resource_version: str | None) -> None:
        name = body["metadata"]["name"]
        current = self.slices.get(name)
        if (current is None) != (resource_version is None) or (
                current is not None and current["metadata"]["resourceVersion"] != resource_version):
            raise RuntimeError("conflict")
        self.writes += 1
        self.slices[name] = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.writes)}}


@dataclass
class DraNode:
    """A running plugin and the fake kubelet registered with it."""

    driver: DraDriver
    kubelet: FakeDraKubelet
    claims: ClaimStore
    directory: str
    cards: list[GpuInventory]

    @property
    def cdi_dir(self) -> str:
        return f"{self.directory}/cdi"

    def options(self) -> DraOptions:
        return DraOptions(f"{self.directory}/kubelet", self.cdi_dir)

    def remove_card(self, index: int) -> None:
        inv = self.cards[0]
        keep = [i for i, c in enumerate(inv.cards) if c.index != index]
        self.cards[0] = replace(inv, cards=tuple(inv.cards[i] for i in keep),
                                device_paths=tuple(inv.device_paths[i] for i in keep),
                                pci_bus_ids=tuple(inv.pci_bus_ids[i] for i in keep))


def make_driver(directory: str, claims: ClaimStore, cards: list[GpuInventory],
                held_elsewhere: HeldElsewhere | None = None) -> DraDriver:
    """A driver on ``directory`` (kubelet dir, CDI dir, checkpoint), reading ``claims``."""
    return DraDriver(NODE, "gpupool.io", DraOptions(f"{directory}/kubelet", f"{directory}/cdi"),
                     lambda: cards[0], claims.read, SliceDict(), held_elsewhere=held_elsewhere)


@contextlib.asynccontextmanager
async def serving(directory: str, claims: ClaimStore, cards: list[GpuInventory],
                  held_elsewhere: HeldElsewhere | None = None) -> AsyncIterator[DraNode]:
    """The plugin served and registered; stopped afterwards (its files stay in ``directory``)."""
    driver = make_driver(directory, claims, cards, held_elsewhere)
    await driver.server.start()
    try:
        kubelet = FakeDraKubelet()
        await kubelet.register(driver.server.socket_path)
        yield DraNode(driver, kubelet, claims, directory, cards)
    finally:
        await driver.server.stop()


def temp_dir() -> tempfile.TemporaryDirectory[str]:
    """A short temporary directory (unix socket paths are limited to 107 bytes)."""
    return tempfile.TemporaryDirectory(prefix="dra-", dir="/tmp")
