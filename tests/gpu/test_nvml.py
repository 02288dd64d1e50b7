"""The node agent's NVML backend against NVIDIA's real libnvidia-ml: inventory and per-process use.

Needs a GPU and PyTorch (the process that uses the card); everywhere else every test skips.
"""

from __future__ import annotations

import glob
import subprocess
import sys
import time

import pytest

from gpupool.nodeagent.nvml.real import NvmlBackend

HELD_MIB = 2048
HOLDER = (f"import torch, time; x = torch.empty({HELD_MIB} << 20, dtype=torch.uint8, device='cuda'); "
          "print('ready', flush=True); time.sleep(60)")
SEEN_WITHIN_S = 10.0


def _why_not() -> str | None:
    if not glob.glob("/dev/nvidia[0-9]*"):
        return "no NVIDIA GPU on this machine (/dev/nvidia0 missing)"
    try:
        import pynvml
        import torch
    except ImportError as exc:
        return f"{exc.name} is not installed"
    del pynvml, torch
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


def test_the_inventory_names_every_card_with_its_uuid_memory_and_bus() -> None:
    backend = NvmlBackend()
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    assert inventory.cards
    for card, path, bus in zip(inventory.cards, inventory.device_paths, inventory.pci_bus_ids, strict=True):
        assert card.uuid.startswith(("GPU-", "MIG-")) and card.memory_mib > 0 and card.healthy
        assert path.startswith("/dev/nvidia") and bus.count(":") == 2


def test_a_process_holding_memory_shows_in_the_usage_sample() -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    backend = NvmlBackend()
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        deadline, seen = time.monotonic() + SEEN_WITHIN_S, None
        while seen is None and time.monotonic() < deadline:
            processes = [p for card in backend.sample_usage().cards for p in card.processes]
            seen = next((p for p in processes if p.pid == holder.pid), None)
            time.sleep(0.5)
        assert seen is not None, "the holder never appeared in NVML's process list"
        assert seen.memory_used_mib >= HELD_MIB
    finally:
        holder.kill()
        holder.wait()
        backend.close()
