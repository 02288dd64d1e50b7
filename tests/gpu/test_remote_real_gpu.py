"""Remote GPUs on a real GPU: the GPU server on NVIDIA's driver, a CUDA driver-API program through the
GPU client over loopback, the same results as the program on the driver itself.

The program is bench/remote_probe.c with its kernels as PTX (bench/remote_probe_kernels.ptx): the
driver compiles them for the card, the server learns their parameter layout from the driver
(``cuFuncGetParamInfo``). Skips without a GPU, the driver library or a C compiler, saying which.
Prints the round trip, copy and launch figures of both paths for docs/remote-gpu.md.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.shim.build import find_compiler
from gpupool.shim.remote_build import build_client
from tests.gpu.remote_gpu_support import nvidia_library, serving_first_card

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "bench" / "remote_probe.c"
PTX = REPO / "bench" / "remote_probe_kernels.ptx"
TOKEN = "g" * 43
N = 1_000_000


def _why_not() -> str | None:
    if not glob.glob("/dev/nvidia[0-9]*"):
        return "no NVIDIA GPU on this machine (/dev/nvidia0 missing)"
    if nvidia_library("libcuda.so.1") is None:
        return "no libcuda.so.1 (NVIDIA's driver library) found"
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found (the card's UUID is read with it)"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the probe program, the GPU client's directory)."""
    out = tmp_path_factory.mktemp("remote-real")
    client_dir = build_client(grant_path=str(out / "grant"))
    program = out / "remote_probe"
    subprocess.run([*find_compiler(), "-O1", "-o", str(program), str(PROBE), f"-L{client_dir}", "-lcuda"],
                   check=True, timeout=120)
    return program, client_dir


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """``gpupool remote-gpu serve`` on NVIDIA's driver, for the first card; yields its port."""
    with serving_first_card(tmp_path_factory.mktemp("remote-server"), TOKEN, "ns/remote-probe") as port:
        yield port


def run(program: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([str(program), *args], env=env, capture_output=True, text=True, timeout=300, check=False)
    return (done.stdout + done.stderr).strip()


def local_env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}, "REMOTE_PROBE_PTX": str(PTX)}


def remote_env(client_dir: Path, port: int) -> dict[str, str]:
    return {**local_env(), "LD_LIBRARY_PATH": str(client_dir), "GPUPOOL_REMOTE_ENDPOINT": f"127.0.0.1:{port}",
            "GPUPOOL_REMOTE_TOKEN": TOKEN, "GPUPOOL_REMOTE_DEADLINE_MS": "30000"}


def test_a_vector_add_through_the_gpu_server_gives_the_drivers_own_result(
        probe: tuple[Path, Path], server: int) -> None:
    program, client_dir = probe
    local = run(program, local_env(), "vector_add", str(N))
    assert local.startswith(f"ok vector_add {N}"), local
    remote = run(program, remote_env(client_dir, server), "vector_add", str(N))
    assert remote == local


def test_the_figures_of_both_paths(probe: tuple[Path, Path], server: int) -> None:
    program, client_dir = probe
    figures = {}
    for name, env in (("local", local_env()), ("remote", remote_env(client_dir, server))):
        out = run(program, env, "bench", "5000", "64", "5000")
        figures[name] = json.loads(out.splitlines()[-1])
        assert figures[name]["launches_per_s"] > 0, out
    print("\nremote GPU on a real card (loopback):", json.dumps(figures))
