"""The library's heartbeat beside NVIDIA's real driver: a PyTorch process under the library
registers at its first CUDA call and renews at the interval the agent asks, stops renewing while
stopped (``SIGSTOP``) and renews again once continued.

Needs a GPU and PyTorch built with CUDA; everywhere else it skips and says why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpupool.shim.build import build_library
from gpupool.testing.gpu_presence import why_no_torch_gpu
from tests.shim.fake_agent import FakeAgent, replying

TOKEN = "ab" * 32
CHILD = (
    "import sys, torch\n"
    "torch.zeros(1, device='cuda')\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
)


pytestmark = pytest.mark.skipif(why_no_torch_gpu() is not None, reason=why_no_torch_gpu() or "")


def test_a_cuda_process_renews_its_registration_until_stopped(tmp_path: Path) -> None:
    socket_path = Path(f"/tmp/gpupool-hb-{os.getpid()}.sock")
    agent = FakeAgent(socket_path, replying(b'{"v":1,"ok":true,"renewS":1}\n'))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "CUDA_DEVICE_"))}
    env.update(LD_PRELOAD=str(build_library()), GPUPOOL_SHIM_DIR=str(tmp_path), GPUPOOL_MEMORY_LIMIT_MIB="4096",
               GPUPOOL_SHIM_TOKEN=TOKEN, GPUPOOL_AGENT_SOCKET=str(socket_path), GPUPOOL_POD="ml/hb",
               GPUPOOL_CONTAINER="main", GPUPOOL_SHIM_LOG="info")
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(3.5)
        running = len(agent.requests)
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.2)  # a renewal already on the wire lands
        stopped_at = len(agent.requests)
        time.sleep(3.0)
        while_stopped = len(agent.requests) - stopped_at
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(2.0)
        resumed = len(agent.requests) - stopped_at - while_stopped
        print(f"\n  requests: {running} in the first 3.5 s, {while_stopped} in 3 s stopped, {resumed} in 2 s after")
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
        _, stderr = child.communicate("\n", timeout=30)
        agent.close()
        socket_path.unlink(missing_ok=True)
    assert running >= 3, stderr
    assert all(r["token"] == TOKEN and r["container"] == "main" for r in agent.requests)
    assert while_stopped == 0
    assert resumed >= 1, stderr
    assert stderr.count("registered with the node agent") == 1, stderr
