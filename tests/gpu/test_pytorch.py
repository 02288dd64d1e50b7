"""PyTorch under the interception library on a real GPU: what an ML engineer's job sees.

Needs a GPU and PyTorch built with CUDA; everywhere else every test skips and says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.shim.build import build_library
from gpupool.testing.gpu_presence import why_no_torch_gpu

LIMIT_MIB = 4096
BLOCK = 512 << 20
THROTTLED_SLOWDOWN = 2.0  # a 30 % share stretches the loop to about 3.3 times
#: 8192^3 bf16 products: ~2.4 s on an H200 alone. Long enough for the controller: NVML's
#: per-process samples come every ~1/6 s, and the first ones only set the bucket's rate.
MATMULS = 1500

PROGRAM = Path(__file__).resolve().parent / "programs" / "torch_check.py"


pytestmark = pytest.mark.skipif(why_no_torch_gpu() is not None, reason=why_no_torch_gpu() or "")


def run(tmp_path: Path, *args: str, **variables: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "CUDA_DEVICE_", "PYTORCH_CUDA"))}
    env.update(LD_PRELOAD=str(build_library()), GPUPOOL_SHIM_DIR=str(tmp_path), **variables)
    done = subprocess.run([sys.executable, str(PROGRAM), *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, f"the job failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}"
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("allocator", [
    pytest.param("", id="caching-allocator"),
    pytest.param("backend:cudaMallocAsync", id="stream-ordered"),
    pytest.param("expandable_segments:True", id="expandable-segments"),
])
def test_pytorch_runs_out_of_memory_at_the_limit(tmp_path: Path, allocator: str) -> None:
    extra = {"PYTORCH_CUDA_ALLOC_CONF": allocator} if allocator else {}
    out = run(tmp_path, "memory", str(BLOCK), GPUPOOL_MEMORY_LIMIT_MIB=str(LIMIT_MIB), **extra)
    assert out["info"] == [LIMIT_MIB << 20, LIMIT_MIB << 20]  # the framework sizes itself from these
    assert out["oom"] is True
    assert 6 <= int(str(out["blocks"])) <= LIMIT_MIB * (1 << 20) // BLOCK  # stopped at the limit, not before
    assert out["again"] is True  # freed memory is usable again
    assert out["graph"] is True  # CUDA graph capture still works under the limit


def test_a_compute_share_slows_a_pytorch_loop_down(tmp_path: Path) -> None:
    alone = float(str(run(tmp_path, "spin", str(MATMULS))["seconds"]))
    throttled = float(str(run(tmp_path, "spin", str(MATMULS), GPUPOOL_COMPUTE_PERCENT="30")["seconds"]))
    assert throttled >= THROTTLED_SLOWDOWN * alone, (alone, throttled)
