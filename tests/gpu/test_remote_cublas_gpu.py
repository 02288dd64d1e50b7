"""cuBLAS through the GPU server on a real GPU (docs/remote-gpu.md, "cuBLAS"): the server on
NVIDIA's driver with NVIDIA's libcublas.so.12, a SGEMM of 1024 x 1024 through gpupool's libcudart and
libcublas over loopback, and the same program on NVIDIA's libcudart and libcublas on the machine
itself: the two results agree within float tolerance. Prints both runs' timings.

Skips, saying which is missing, without a GPU, NVIDIA's driver library, nvidia-smi, NVIDIA's
libcublas.so.12 or libcudart.so.12 (found by ldconfig or in the nvidia-cublas-cu12 and
nvidia-cuda-runtime-cu12 wheels' site-packages directories) or a C compiler.
"""

from __future__ import annotations

import array
import glob
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.shim.build import find_compiler
from gpupool.shim.remote_build import build_client
from tests.gpu.remote_gpu_support import nvidia_library, serving_first_card, why_not_serve

REPO = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).with_name("programs") / "cublas_sgemm.c"
TOKEN = "c" * 43
N = 1024


def why_not() -> str | None:
    if not glob.glob("/dev/nvidia[0-9]*"):
        return "no NVIDIA GPU on this machine (/dev/nvidia0 missing)"
    return why_not_serve("libcublas.so.12", "libcudart.so.12")


pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SGEMM program, linked by soname only: LD_LIBRARY_PATH picks NVIDIA's or gpupool's libraries."""
    out = tmp_path_factory.mktemp("cublas-gpu")
    client = build_client(grant_path=str(out / "grant"))
    built = out / "cublas_sgemm"
    subprocess.run([*find_compiler(), "-O1", "-o", str(built), str(PROGRAM), f"-L{client}", "-lcublas", "-lcudart",
                    f"-Wl,-rpath-link,{client}"], check=True, timeout=120)
    return built


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """``gpupool remote-gpu serve`` on NVIDIA's driver and cuBLAS, for the first card; yields its port."""
    with serving_first_card(tmp_path_factory.mktemp("cublas-server"), TOKEN, "ns/cublas-probe",
                            env={"GPUPOOL_REMOTE_CUBLAS": str(nvidia_library("libcublas.so.12"))}) as port:
        yield port


def sgemm(program: Path, out: Path, library_path: str, extra: dict[str, str]) -> tuple[list[float], str]:
    """The program's C (as floats) and its timing line."""
    env = {**os.environ, "LD_LIBRARY_PATH": library_path, **extra}
    done = subprocess.run([str(program), str(N), str(out)], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    values = array.array("f")
    values.frombytes(out.read_bytes())
    return list(values), done.stdout.strip()


def test_a_remote_sgemm_equals_the_local_one(program: Path, server: int, tmp_path: Path) -> None:
    """The same SGEMM on NVIDIA's libraries here and through the GPU client: the same C."""
    client_dir = build_client(grant_path=str(program.parent / "grant"))  # the environment names the server
    blas, runtime = nvidia_library("libcublas.so.12"), nvidia_library("libcudart.so.12")
    assert blas is not None and runtime is not None
    nvidia = f"{blas.parent}:{runtime.parent}"
    local, local_timing = sgemm(program, tmp_path / "local.bin", nvidia, {})
    remote, remote_timing = sgemm(program, tmp_path / "remote.bin", str(client_dir), {
        "GPUPOOL_REMOTE_ENDPOINT": f"127.0.0.1:{server}", "GPUPOOL_REMOTE_TOKEN": TOKEN})
    print(f"\nSGEMM {N}x{N} local  (create upload gemm download ms): {local_timing}")
    print(f"SGEMM {N}x{N} remote (create upload gemm download ms): {remote_timing}")
    assert len(local) == len(remote) == N * N
    worst = max(abs(a - b) / max(1.0, abs(a)) for a, b in zip(local, remote, strict=True))
    assert worst < 1e-3, f"largest relative difference {worst}"
