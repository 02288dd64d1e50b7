"""The grant of a virtual-card slice (one card booked as ``devices`` = n) tells the library to
present the card as n CUDA ordinals; every other grant reads exactly as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.api.shim_contract import NodeGrant, ShimProtocolError, decode_grant, encode_grant
from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.nodeagent.container_grant import GrantError
from gpupool.nodeagent.isolation.shim_grant import node_grant
from gpupool.nodeagent.types import NodeAssignment, PodView
from tests.nodeagent.isolation.test_shim_backend import UID, backend


def pod(*slices: CardSlice) -> PodView:
    placement = Placement("ns/p", "node-a", 0, 0, (ContainerAssignment("main", slices),))
    return PodView("ns", "p", UID, "node-a", 0.0, False, (),
                   assignment=NodeAssignment(placement, {1: "GPU-one", 3: "GPU-three"}))


def grant(memory: tuple[int, ...] = (8192,), virtual: int = 1) -> NodeGrant:
    return NodeGrant(memory, (40,) * len(memory), "hard", (), "/r", "/s", "t", "ns/p", "main", virtual_devices=virtual)


def test_a_virtual_card_slice_is_granted_as_one_card_of_n_devices(tmp_path: Path) -> None:
    shim = backend(tmp_path / "state")
    extras = shim.grant_extras(pod(CardSlice(1, 8192, 400, devices=2)), "main")
    text = (Path(extras.mounts[2].host_path) / "grant").read_text()
    assert "virtual_devices=2\n" in text
    written = decode_grant(text)
    assert (written.memory_mib, written.compute_percent, written.card_uuids, written.virtual_devices) == (
        (8192,), (40,), ("GPU-one",), 2)


def test_an_exclusive_virtual_card_keeps_the_whole_card_and_its_devices() -> None:
    written = node_grant(pod(CardSlice(3, 81920, 1000, exclusive=True, devices=4)), "main", "t", "hard")
    assert (written.memory_mib, written.virtual_devices) == ((81920,), 4)


def test_a_plain_grant_has_no_virtual_key_and_reads_as_one_device(tmp_path: Path) -> None:
    """An older grant (no key) and a plain slice's grant both mean one device per card."""
    shim = backend(tmp_path / "state")
    extras = shim.grant_extras(pod(CardSlice(1, 4096, 300), CardSlice(3, 2048, 0)), "main")
    text = (Path(extras.mounts[2].host_path) / "grant").read_text()
    assert "virtual_devices" not in text
    assert decode_grant(text).virtual_devices == 1


def test_a_virtual_card_beside_other_cards_is_refused() -> None:
    with pytest.raises(GrantError, match="only card"):
        node_grant(pod(CardSlice(1, 8192, 0, devices=2), CardSlice(3, 1024, 0)), "main", "t", "hard")


@pytest.mark.parametrize("devices", [0, -1, 17, 1 << 40])
def test_a_device_count_the_library_cannot_present_is_never_written(devices: int) -> None:
    with pytest.raises(ShimProtocolError, match="virtual_devices"):
        grant(virtual=devices)


def test_several_cards_cannot_be_presented_as_virtual_devices() -> None:
    with pytest.raises(ShimProtocolError, match="only one card"):
        grant(memory=(4096, 4096), virtual=2)


@pytest.mark.parametrize("value", ["0", "-2", "17", "two", ""])
def test_a_bad_count_in_a_grant_file_is_refused_on_reading(value: str) -> None:
    text = encode_grant(grant()) + f"virtual_devices={value}\n"
    with pytest.raises(ShimProtocolError):
        decode_grant(text)


def test_the_count_round_trips() -> None:
    assert decode_grant(encode_grant(grant(virtual=16))) == grant(virtual=16)
