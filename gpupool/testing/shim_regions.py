"""Stand-in interception-library regions: files with the layout :mod:`gpupool.shim.region` reads, as
the library in a container would write them (the lending tests and ``bench/reclaim.py``)."""

from __future__ import annotations

from pathlib import Path

from gpupool.api.shim_contract import REGION_FILE
from gpupool.shim import region as layout

MIB = 1024 * 1024
USED_FIELD, UTIL_FIELD = 0, 11
"""Positions of ``used`` and ``util_container`` among the device record's fields."""


def region_bytes(cards: dict[int, tuple[int, int]]) -> bytes:
    """A region whose card at each ordinal has (used MiB, container utilisation %)."""
    data = bytearray(layout.SIZE)
    layout.HEADER.pack_into(data, 0, layout.MAGIC, layout.VERSION, layout.SIZE, layout.MAX_DEVICES,
                            layout.SLOTS, 0)
    for ordinal, (used_mib, percent) in cards.items():
        fields = [0] * len(layout.DEVICE.unpack_from(data, layout.DEVICES_OFFSET))
        fields[USED_FIELD], fields[UTIL_FIELD] = used_mib * MIB, percent
        layout.DEVICE.pack_into(data, layout.DEVICES_OFFSET + ordinal * layout.DEVICE.size, *fields)
    return bytes(data)


def region_path(state_dir: Path, pod_uid: str, container: str = "c") -> Path:
    """Where the agent's layout puts a container's region (``<state>/containers/<uid>_<container>``)."""
    return state_dir / "containers" / f"{pod_uid}_{container}" / REGION_FILE


def write_region(state_dir: Path, pod_uid: str, cards: dict[int, tuple[int, int]], container: str = "c") -> Path:
    """Write (or replace) a container's region."""
    path = region_path(state_dir, pod_uid, container)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(region_bytes(cards))
    return path
