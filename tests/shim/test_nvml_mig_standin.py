"""MIG discovery through nvidia-ml-py's real bindings, against the stand-in libnvidia-ml in MIG mode
(``GPUPOOL_STANDIN_MIG``; no real card's MIG mode is ever touched): card 0 is published as its two
MIG devices, card 1 stays physical, card 2, whose MIG query fails, is a physical card and a warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.shim.toolchain import CLEARED_PREFIXES, RUN_TIMEOUT_S, Toolchain

READ_INVENTORY = """
import json, logging
from gpupool.nodeagent.nvml.real import NvmlBackend
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
backend = NvmlBackend()
inventory = backend.inventory()
backend.close()
print(json.dumps([[c.uuid, c.kind.value, c.memory_mib, c.compute, c.profile, c.parent, inventory.device_path(c.index)]
                  for c in inventory.cards]))
"""


@pytest.mark.slow
def test_mig_devices_are_read_through_the_real_bindings(plain: Toolchain) -> None:
    pytest.importorskip("pynvml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED_PREFIXES)}
    env.update(LD_LIBRARY_PATH=str(plain.standin), GPUPOOL_STANDIN_DEVICES="3", GPUPOOL_STANDIN_MEMORY_MIB="143771",
               GPUPOOL_STANDIN_MIG="0=3g.71424,1c.2g.35584;2=error", PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", READ_INVENTORY], env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=True)
    assert json.loads(done.stdout) == [
        ["MIG-standin-0-0", "virtual", 71424, 428, "3g.70gb", "GPU-standin-0", "/dev/nvidia0"],
        ["MIG-standin-0-1", "virtual", 35584, 142, "1c.2g.35gb", "GPU-standin-0", "/dev/nvidia0"],
        ["GPU-standin-1", "physical", 143771, 1000, "", "", "/dev/nvidia1"],
        ["GPU-standin-2", "physical", 143771, 1000, "", "", "/dev/nvidia2"],
    ]
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "GPU-standin-2" in warnings[0] and "physical card" in warnings[0], done.stderr
