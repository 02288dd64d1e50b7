"""The MPS backend on a real GPU: NVIDIA's control daemon started the way the node agent starts it,
and a PyTorch job given exactly the environment and the pipe directory a granted container gets.

Needs a GPU, nvidia-cuda-mps-control and PyTorch; everywhere else every test skips and says why.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.api.environment import MPS_LOG_DIRECTORY, MPS_PIPE_DIRECTORY, CardShare, ContainerEnvironment
from gpupool.nodeagent.isolation.mps_backend import MpsLayout, daemon_command

PROGRAM = Path(__file__).resolve().parent / "programs" / "torch_check.py"
LIMIT_MIB = 4096
BLOCK = 512 << 20
MATMULS = 1500
THROTTLED_SLOWDOWN = 2.0  # 30 % of the SMs stretch a loop of full-card products about threefold
DAEMON_READY_S = 10.0


CONTROL = "nvidia-cuda-mps-control"
DRIVER_BIN = "/usr/local/nvidia/bin"  # where GPU operator and device-plugin images put the driver's tools


def _control() -> str | None:
    return shutil.which(CONTROL) or shutil.which(CONTROL, path=DRIVER_BIN)


def _why_not() -> str | None:
    if not glob.glob("/dev/nvidia[0-9]*"):
        return "no NVIDIA GPU on this machine (/dev/nvidia0 missing)"
    if _control() is None:
        return "nvidia-cuda-mps-control not found"
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    del torch
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MpsLayout]:
    layout = MpsLayout(str(tmp_path_factory.mktemp("mps-state")))
    for path in (layout.pipe_dir, layout.log_dir):
        os.makedirs(path, exist_ok=True)
    command, variables = daemon_command(layout, _control() or "")
    process = subprocess.Popen(command, env={**os.environ, **variables}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + DAEMON_READY_S
    while not os.path.exists(os.path.join(layout.pipe_dir, "control")) and time.monotonic() < deadline:
        assert process.poll() is None, f"the control daemon exited: {process.communicate()[0]}"
        time.sleep(0.1)
    try:
        yield layout
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run(layout: MpsLayout, compute_percent: int, *args: str) -> dict[str, object]:
    """The job with the variables Allocate hands a container, as a client of the daemon."""
    import pynvml

    pynvml.nvmlInit()
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    share = ContainerEnvironment("default/job", "main", (CardShare(0, str(uuid), LIMIT_MIB, compute_percent),))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "CUDA_MPS_", "PYTORCH_CUDA"))}
    env.update(share.to_env(), **{MPS_PIPE_DIRECTORY: layout.pipe_dir, MPS_LOG_DIRECTORY: layout.log_dir})
    done = subprocess.run([sys.executable, str(PROGRAM), *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, f"the job failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}"
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_an_mps_client_runs_out_of_memory_at_its_pinned_limit(daemon: MpsLayout) -> None:
    out = run(daemon, 0, "memory", str(BLOCK))
    assert out["oom"] is True
    assert int(str(out["blocks"])) <= LIMIT_MIB * (1 << 20) // BLOCK
    assert out["graph"] is True


def test_an_mps_client_gets_its_share_of_the_sms(daemon: MpsLayout) -> None:
    alone = float(str(run(daemon, 0, "spin", str(MATMULS))["seconds"]))
    throttled = float(str(run(daemon, 30, "spin", str(MATMULS))["seconds"]))
    assert throttled >= THROTTLED_SLOWDOWN * alone, (alone, throttled)
