"""NVML reports the container's limit, also for tools that load NVML through ctypes (dlsym)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.shim.toolchain import Holder, Toolchain

GIB = 1 << 30
READ_MEMORY = """
import pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
print(v1.total, v1.free, v1.used, v2.total, v2.free, v2.used)
"""


def test_nvml_memory_info_shows_the_limit_and_the_container_use(plain: Toolchain, work: Path) -> None:
    env = plain.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    holder = Holder(plain, env, "alloc:1g")
    try:
        holder.wait_ready()
        done = subprocess.run([sys.executable, "-c", READ_MEMORY], env=env, capture_output=True, text=True,
                              timeout=60, check=True)
    finally:
        holder.kill()
    total, free, used = 4 * GIB, 3 * GIB, GIB
    assert [int(v) for v in done.stdout.split()] == [total, free, used] * 2


def test_nvml_without_limits_reports_the_card(plain: Toolchain, work: Path) -> None:
    done = subprocess.run([sys.executable, "-c", READ_MEMORY], env=plain.env(work), capture_output=True, text=True,
                          timeout=60, check=True)
    assert [int(v) for v in done.stdout.split()] == [16 * GIB, 16 * GIB, 0] * 2
