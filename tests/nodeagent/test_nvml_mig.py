"""MIG discovery in the NVML backend, against a stub of pynvml (no GPU here, and MIG mode is never
changed on a real machine): a card in MIG mode is published as its MIG devices, each a virtual card
with its own memory, slices/7 of the card's compute, its profile and its parent; a card not in MIG
mode, or whose MIG query fails, stays one physical card (with a warning for the failure)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpupool.api.annotations import Inventory, decode_inventory, encode_inventory
from gpupool.core.model import GpuKind, LinkLevel
from gpupool.nodeagent.nvml import real
from gpupool.nodeagent.nvml.mig import profile_name

MIB = 1024 * 1024
NOT_SUPPORTED, NOT_FOUND, UNKNOWN = 3, 6, 999


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Mig:
    """A MIG device: uuid, GPU/compute instance ids and slices, memory (MiB), the driver's name."""

    uuid: str
    gi: int
    ci: int
    gi_slices: int
    ci_slices: int
    memory: int
    name: str


@dataclass
class Card:
    uuid: str
    memory: int = 143771
    name: str = "NVIDIA H200"
    mig_mode: int | Exception = 0
    slots: list[Mig | None] = field(default_factory=list)
    slot_error: Exception | None = None


@dataclass
class StubNvml:
    """The calls the NVML backend makes, over a list of cards (handles are the stub's objects)."""

    cards: list[Card]
    NVML_ERROR_NOT_SUPPORTED: int = NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND: int = NOT_FOUND
    NVML_DEVICE_MIG_ENABLE: int = 1
    NVML_GPU_INSTANCE_PROFILE_7_SLICE: int = 4
    NVML_P2P_CAPS_INDEX_NVLINK: int = 2
    NVML_P2P_STATUS_OK: int = 0
    mig_mode_writes: int = 0

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Card:
        return self.cards[i]

    def nvmlDeviceGetMemoryInfo(self, h: Card | Mig) -> Any:
        return SimpleNamespace(total=h.memory * MIB, used=0, free=h.memory * MIB)

    def nvmlDeviceGetUUID(self, h: Card | Mig) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: Card | Mig) -> str:
        return h.name

    def nvmlDeviceGetMinorNumber(self, h: Card) -> int:
        return self.cards.index(h)

    def nvmlDeviceGetPciInfo(self, h: Card) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x3B + self.cards.index(h):02X}:00.0")

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Card, b: Card) -> int:
        return 20

    def nvmlDeviceGetP2PStatus(self, a: Card, b: Card, caps: int) -> int:
        raise NVMLError(NOT_SUPPORTED)

    def nvmlDeviceGetMigMode(self, h: Card) -> list[int]:
        if isinstance(h.mig_mode, Exception):
            raise h.mig_mode
        return [h.mig_mode, h.mig_mode]

    def nvmlDeviceSetMigMode(self, h: Card, mode: int) -> None:  # must never be called
        self.mig_mode_writes += 1

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: Card, profile: int) -> Any:
        if profile != self.NVML_GPU_INSTANCE_PROFILE_7_SLICE:
            raise NVMLError(NOT_SUPPORTED)
        return SimpleNamespace(sliceCount=7)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Card) -> int:
        return len(h.slots)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Card, slot: int) -> Mig:
        if h.slot_error is not None:
            raise h.slot_error
        found = h.slots[slot]
        if found is None:
            raise NVMLError(NOT_FOUND)
        return found

    def nvmlDeviceGetAttributes(self, m: Mig) -> Any:
        return SimpleNamespace(gpuInstanceSliceCount=m.gi_slices, computeInstanceSliceCount=m.ci_slices,
                               memorySizeMB=m.memory, multiprocessorCount=0)

    def nvmlDeviceGetGpuInstanceId(self, m: Mig) -> int:
        return m.gi

    def nvmlDeviceGetComputeInstanceId(self, m: Mig) -> int:
        return m.ci


def h200_mig(uuid: str, gi: int, slices: int, memory: int, profile: str, ci_slices: int | None = None) -> Mig:
    return Mig(uuid, gi, 0, slices, ci_slices or slices, memory, f"NVIDIA H200 MIG {profile}")


def backend_over(stub: StubNvml, monkeypatch: pytest.MonkeyPatch, proc_root: Path | None = None,
                 devices: frozenset[str] | None = None) -> real.NvmlBackend:
    """The NVML backend over ``stub``; the driver's capability files under ``proc_root`` (none by
    default) and the host's device nodes ``devices`` (by default every one asked about exists)."""
    monkeypatch.setattr(real, "_load", lambda: stub)
    return real.NvmlBackend(proc_root=str(proc_root or "/nonexistent-proc"),
                            device_exists=lambda path: devices is None or path in devices)


def write_access(proc_root: Path, card_minor: int, gpu_instance: int, compute_instance: int | None, minor: int) -> None:
    """A capability file as the driver writes it: ``.../gpu<m>/mig/gi<g>[/ci<c>]/access``."""
    where = proc_root / "driver/nvidia/capabilities" / f"gpu{card_minor}" / "mig" / f"gi{gpu_instance}"
    if compute_instance is not None:
        where = where / f"ci{compute_instance}"
    where.mkdir(parents=True, exist_ok=True)
    (where / "access").write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 444\nDeviceFileModify: 1\n")


def mixed_node() -> StubNvml:
    """Card 0 in MIG mode (3g.71gb, an empty slot, 2g.35gb, 1c.2g.35gb), card 1 a whole card."""
    return StubNvml([
        Card("GPU-parent", mig_mode=1, slots=[
            h200_mig("MIG-a", 2, 3, 71424, "3g.71gb"), None,
            h200_mig("MIG-b", 3, 2, 35584, "2g.35gb"),
            h200_mig("MIG-c", 5, 2, 35584, "1c.2g.35gb", ci_slices=1)]),
        Card("GPU-whole")])


def test_a_card_in_mig_mode_is_published_as_its_mig_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = mixed_node()
    inventory = backend_over(stub, monkeypatch).inventory()
    found = [(c.index, c.uuid, c.kind, c.memory_mib, c.compute, c.profile, c.parent) for c in inventory.cards]
    assert found == [
        (0, "MIG-a", GpuKind.VIRTUAL, 71424, 428, "3g.71gb", "GPU-parent"),
        (1, "MIG-b", GpuKind.VIRTUAL, 35584, 285, "2g.35gb", "GPU-parent"),
        (2, "MIG-c", GpuKind.VIRTUAL, 35584, 142, "1c.2g.35gb", "GPU-parent"),
        (3, "GPU-whole", GpuKind.PHYSICAL, 143771, 1000, "", ""),
    ]
    assert inventory.device_paths == ("/dev/nvidia0",) * 3 + ("/dev/nvidia1",)
    assert inventory.pci_bus_ids == ("00000000:3B:00.0",) * 3 + ("00000000:3C:00.0",)
    levels = inventory.topology.levels
    assert levels[0][1] == levels[1][2] == LinkLevel.NVLINK  # one board
    assert levels[0][3] == LinkLevel.MULTI_SWITCH  # the physical cards' level
    assert stub.mig_mode_writes == 0


def test_cards_not_in_mig_mode_or_without_mig_support_stay_physical(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    stub = StubNvml([Card("GPU-off", mig_mode=0), Card("GPU-old", mig_mode=NVMLError(NOT_SUPPORTED))])
    with caplog.at_level(logging.WARNING):
        cards = backend_over(stub, monkeypatch).inventory().cards
    assert [(c.uuid, c.kind, c.compute, c.profile) for c in cards] == [
        ("GPU-off", GpuKind.PHYSICAL, 1000, ""), ("GPU-old", GpuKind.PHYSICAL, 1000, "")]
    assert not caplog.records


@pytest.mark.parametrize("card", [
    pytest.param(Card("GPU-x", mig_mode=NVMLError(UNKNOWN)), id="mode-query-fails"),
    pytest.param(Card("GPU-x", mig_mode=1, slots=[None], slot_error=NVMLError(UNKNOWN)), id="device-query-fails"),
])
def test_a_card_whose_mig_query_fails_is_a_physical_card_with_a_warning(
        card: Card, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    backend = backend_over(StubNvml([card]), monkeypatch)
    with caplog.at_level(logging.WARNING):
        cards = backend.inventory().cards
        backend.inventory()
    assert [(c.uuid, c.kind) for c in cards] == [("GPU-x", GpuKind.PHYSICAL)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "GPU-x" in warnings[0] and "physical card" in warnings[0]


def test_a_card_in_mig_mode_without_devices_offers_nothing_and_says_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    backend = backend_over(StubNvml([Card("GPU-empty", mig_mode=1, slots=[None, None])]), monkeypatch)
    with caplog.at_level(logging.WARNING):
        cards = backend.inventory().cards
    assert cards == ()
    assert "no MIG device" in caplog.text


def test_usage_is_sampled_on_the_published_handles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Card indices of a usage sample are the published ones: a MIG device is asked on its own
    handle (where the driver does not answer utilisation, the card is left out: counted active)."""
    stub = mixed_node()
    backend = backend_over(stub, monkeypatch)
    assert [getattr(h, "uuid", None) for h in backend._card_handles()] == ["MIG-a", "MIG-b", "MIG-c", "GPU-whole"]


def test_the_inventory_annotation_carries_kind_compute_profile_and_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = backend_over(mixed_node(), monkeypatch).inventory()
    value = encode_inventory(Inventory(inventory.cards, inventory.topology))
    assert decode_inventory(value).cards == inventory.cards
    assert '"kind":"virtual","computeMilli":428,"profile":"3g.71gb","parent":"GPU-parent"' in value
    assert '"uuid":"GPU-whole","model":"NVIDIA-H200","memoryMiB":143771,"healthy":true}' in value


@pytest.mark.parametrize(("name", "gi", "ci", "memory", "parent", "expected"), [
    ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", 3, 3, 19968, 40536, "3g.20gb"),  # the driver's own name
    ("NVIDIA H100 80GB HBM3", 7, 7, 80896, 81559, "7g.80gb"),  # derived: rounded to eighths of the card
    ("NVIDIA H100 80GB HBM3", 1, 1, 9984, 81559, "1g.10gb"),
    ("NVIDIA H100 80GB HBM3", 3, 1, 40448, 81559, "1c.3g.40gb"),
])
def test_profile_names(name: str, gi: int, ci: int, memory: int, parent: int, expected: str) -> None:
    assert profile_name(name, gi, ci, memory, parent) == expected


def test_mig_devices_carry_their_capability_device_nodes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """MIG-a (GPU instance 2, compute instance 0) has both capability files; MIG-b's compute
    instance file is missing, so it gets none (the runtime adds them) rather than half of them."""
    write_access(tmp_path, 0, 2, None, 21)
    write_access(tmp_path, 0, 2, 0, 22)
    write_access(tmp_path, 0, 3, None, 30)
    inventory = backend_over(mixed_node(), monkeypatch, tmp_path).inventory()
    assert inventory.access_paths == (("/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"), (), (), ())
    assert inventory.access_devices(0) == ("/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22")


def test_capability_nodes_missing_on_the_host_are_not_granted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A device spec naming a node the host lacks would stop the container from starting."""
    write_access(tmp_path, 0, 2, None, 21)
    write_access(tmp_path, 0, 2, 0, 22)
    only_one = frozenset({"/dev/nvidia-caps/nvidia-cap21"})
    assert backend_over(mixed_node(), monkeypatch, tmp_path, only_one).inventory().access_devices(0) == ()


def test_an_xid_on_a_card_in_mig_mode_marks_each_of_its_mig_devices_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = mixed_node()
    events = [SimpleNamespace(device=stub.cards[0], eventData=79)]
    stub_calls: dict[str, Any] = {
        "nvmlEventSetCreate": lambda: "set", "nvmlDeviceRegisterEvents": lambda h, kinds, s: None,
        "nvmlEventTypeXidCriticalError": 8,
        "nvmlEventSetWait": lambda s, ms: events.pop() if events else None}
    for name, value in stub_calls.items():
        setattr(stub, name, value)
    backend = backend_over(stub, monkeypatch)

    async def first(n: int) -> list[tuple[int, bool, str]]:
        found: list[tuple[int, bool, str]] = []
        async for event in backend.health_events():
            found.append((event.card, event.healthy, event.reason))
            if len(found) == n:
                return found
        return found

    assert asyncio.run(asyncio.wait_for(first(3), 5)) == [(i, False, "XID 79") for i in range(3)]
    assert [c.healthy for c in backend.inventory().cards] == [False, False, False, True]
