"""The node agent's NVML backend (nvidia-ml-py) reads its inventory, PCI bus ids included, from the
stand-in libnvidia-ml: the bus id is what names a card's region of the kernel's dmem controller."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.shim.toolchain import CLEARED_PREFIXES, RUN_TIMEOUT_S, Toolchain

READ_INVENTORY = """
import json
from gpupool.nodeagent.nvml.real import NvmlBackend
backend = NvmlBackend()
inventory = backend.inventory()
backend.close()
print(json.dumps({"uuids": [c.uuid for c in inventory.cards], "paths": list(inventory.device_paths),
                  "buses": [inventory.pci_bus_id(c.index) for c in inventory.cards]}))
"""


@pytest.mark.slow
def test_the_inventory_carries_each_cards_pci_bus_id(plain: Toolchain) -> None:
    pytest.importorskip("pynvml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED_PREFIXES)}
    env.update(LD_LIBRARY_PATH=str(plain.standin), GPUPOOL_STANDIN_DEVICES="2",
               PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", READ_INVENTORY], env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=True)
    found = json.loads(done.stdout)
    assert found == {"uuids": ["GPU-standin-0", "GPU-standin-1"], "paths": ["/dev/nvidia0", "/dev/nvidia1"],
                     "buses": ["00000000:3B:00.0", "00000000:3C:00.0"]}
