"""The interception library against NVIDIA's real driver and CUDA runtime.

Needs a GPU and nvcc; everywhere else every test skips and says why (``pytest -rs`` shows it).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpupool.shim.build import build_library

PROGRAM = Path(__file__).resolve().parent / "programs" / "shim_check.cu"
GIB = 1 << 30
CUDA_SUCCESS = 0
CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation
SPIN_MS, SPINS = 2, 500  # one second of kernels
SYNC_EVERY = 10
THROTTLED_SLOWDOWN = 2.0  # a 30 % share stretches that second to about 3.3


def _why_not() -> str | None:
    if not glob.glob("/dev/nvidia[0-9]*"):
        return "no NVIDIA GPU on this machine (/dev/nvidia0 missing)"
    if shutil.which("nvcc") is None and not glob.glob("/usr/local/cuda*/bin/nvcc"):
        return "nvcc not found (install the CUDA toolkit)"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nvcc = shutil.which("nvcc") or sorted(glob.glob("/usr/local/cuda*/bin/nvcc"))[-1]
    binary = tmp_path_factory.mktemp("gpu") / "shim_check"
    subprocess.run([nvcc, "-O2", "-o", str(binary), str(PROGRAM)], check=True, capture_output=True)
    return binary


def run(program: Path, tmp_path: Path, *args: str, **variables: str) -> dict[str, list[int]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "CUDA_DEVICE_"))}
    env.update(LD_PRELOAD=str(build_library()), GPUPOOL_SHIM_DIR=str(tmp_path), **variables)
    done = subprocess.run([str(program), *args], env=env, capture_output=True, text=True, timeout=120, check=True)
    return {line.split()[0]: [int(v) for v in line.split()[1:]] for line in done.stdout.splitlines()}


def test_cuda_runtime_allocations_stop_at_the_limit(program: Path, tmp_path: Path) -> None:
    lines = run(program, tmp_path, "memory", GPUPOOL_MEMORY_LIMIT_MIB="4096")
    assert lines["info"][0] == CUDA_SUCCESS and lines["info"][2] == 4 * GIB
    assert lines["alloc3g"] == [CUDA_SUCCESS]
    assert lines["alloc2g"] == [CUDA_ERROR_MEMORY_ALLOCATION]
    assert lines["alloc2g_after_free"] == [CUDA_SUCCESS]
    assert lines["async3g"] == [CUDA_ERROR_MEMORY_ALLOCATION]


def test_graph_memory_nodes_count_until_their_graph_is_destroyed(program: Path, tmp_path: Path) -> None:
    lines = run(program, tmp_path, "graph", GPUPOOL_MEMORY_LIMIT_MIB="4096")
    assert lines["create"] == [CUDA_SUCCESS]
    assert lines["node3g"] == [CUDA_SUCCESS]
    assert lines["node2g"] == [CUDA_ERROR_MEMORY_ALLOCATION]
    assert lines["alloc2g"] == [CUDA_ERROR_MEMORY_ALLOCATION]  # the unlaunched node's 3 GiB count
    assert lines["destroy"] == [CUDA_SUCCESS]
    assert lines["alloc2g_after_destroy"] == [CUDA_SUCCESS]


def test_the_pool_release_threshold_stays_zero_under_a_limit(program: Path, tmp_path: Path) -> None:
    assert run(program, tmp_path, "pool", GPUPOOL_MEMORY_LIMIT_MIB="4096")["threshold"] == [CUDA_SUCCESS,
                                                                                           CUDA_SUCCESS, 0]
    unlimited = run(program, tmp_path, "pool")["threshold"]
    assert unlimited == [CUDA_SUCCESS, CUDA_SUCCESS, (1 << 64) - 1]


def test_a_hard_share_slows_kernels_down(program: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    run(program, tmp_path, "spin", str(SPIN_MS), str(SPINS))
    alone = time.monotonic() - started
    started = time.monotonic()
    run(program, tmp_path, "spin", str(SPIN_MS), str(SPINS), GPUPOOL_COMPUTE_PERCENT="30")
    throttled = time.monotonic() - started
    assert throttled >= THROTTLED_SLOWDOWN * alone, (alone, throttled)


def test_a_hard_share_holds_a_program_that_synchronises_often(program: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    run(program, tmp_path, "spinsync", str(SPIN_MS), str(SPINS), str(SYNC_EVERY))
    alone = time.monotonic() - started
    started = time.monotonic()
    run(program, tmp_path, "spinsync", str(SPIN_MS), str(SPINS), str(SYNC_EVERY), GPUPOOL_COMPUTE_PERCENT="30")
    throttled = time.monotonic() - started
    assert throttled >= THROTTLED_SLOWDOWN * alone, (alone, throttled)
