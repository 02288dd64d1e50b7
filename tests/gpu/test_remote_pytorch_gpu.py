"""PyTorch through the GPU server on a real GPU (docs/remote-gpu.md, "PyTorch"): the server on
NVIDIA's driver with NVIDIA's libcublas.so.12, and a 1024 x 1024 float32 matmul
(tests/gpu/programs/torch_matmul.py) run with gpupool's client, runtime, cuBLAS and cuBLASLt preloaded (what
the webhook's LD_PRELOAD gives a pod) and on the machine itself: the two products agree within float
tolerance, and the remote run's mem_get_info reports the booked share; then one of PyTorch's own
kernels (its fatbin loaded on the server's driver), which the stand-in driver cannot run. Prints
both runs' timings.

Skips, saying which is missing, without a GPU, PyTorch seeing it, NVIDIA's driver library,
nvidia-smi, NVIDIA's libcublas.so.12 (ldconfig or the nvidia-cublas-cu12 wheel) or a C compiler.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.shim.remote_build import BLAS_LT_SONAME, BLAS_SONAME, CLIENT_SONAME, RUNTIME_SONAME, build_client
from gpupool.testing.gpu_presence import why_no_torch_gpu
from tests.gpu.remote_gpu_support import nvidia_library, serving_first_card, why_not_serve

PROGRAM = Path(__file__).with_name("programs") / "torch_matmul.py"
TOKEN = "p" * 43
SHARE_MIB = 8192
N = 1024


def why_not() -> str | None:
    reason = why_no_torch_gpu()
    if reason is not None:
        return reason
    return why_not_serve("libcublas.so.12")


pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """``gpupool remote-gpu serve`` on NVIDIA's driver and cuBLAS, for the first card; yields its port."""
    with serving_first_card(tmp_path_factory.mktemp("pytorch-server"), TOKEN, "ns/pytorch-probe", SHARE_MIB,
                            env={"GPUPOOL_REMOTE_CUBLAS": str(nvidia_library("libcublas.so.12"))}) as port:
        yield port


def matmul(out: Path, extra: dict[str, str]) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "LD_PRELOAD"))}
    done = subprocess.run([sys.executable, str(PROGRAM), str(N), str(out)], env={**env, **extra},
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"the program failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}"
    report: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return report


@pytest.fixture(scope="module")
def runs(server: int, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object], dict[str, object]]:
    """The program on the GPU here and through the GPU client: its directory and both reports."""
    out = tmp_path_factory.mktemp("pytorch-runs")
    client = build_client(grant_path=str(out / "grant"))  # the environment names the server
    preload = ":".join(str(client / name) for name in (CLIENT_SONAME, RUNTIME_SONAME, BLAS_SONAME, BLAS_LT_SONAME))
    local = matmul(out / "local.pt", {})
    remote = matmul(out / "remote.pt", {"LD_PRELOAD": preload, "GPUPOOL_REMOTE_ENDPOINT": f"127.0.0.1:{server}",
                                        "GPUPOOL_REMOTE_TOKEN": TOKEN})
    for name, report in (("local ", local), ("remote", remote)):
        print(f"\nmatmul {N}x{N} {name} (upload matmul download ms): {report['upload_ms']} {report['matmul_ms']} "
              f"{report['download_ms']}")
    return out, local, remote


def test_a_remote_pytorch_matmul_equals_the_local_one(
        runs: tuple[Path, dict[str, object], dict[str, object]]) -> None:
    """The same matmul (cuBLAS's SGEMM on the server) on the GPU here and through the GPU client: the
    same product; the remote mem_get_info's total is the booked share."""
    torch = importlib.import_module("torch")  # by name: mypy need not find PyTorch's stubs
    out, _, remote = runs
    assert remote["total"] == SHARE_MIB << 20
    here, there = torch.load(out / "local.pt"), torch.load(out / "remote.pt")
    assert torch.allclose(here, there, rtol=1e-3, atol=1e-3), float((here - there).abs().max())


def test_a_pytorch_kernel_runs_remotely(runs: tuple[Path, dict[str, object], dict[str, object]]) -> None:
    """One of PyTorch's own kernels (torch.ones summed): its fatbin shipped by gpupool's runtime and
    loaded by the server's driver computes what it computes here."""
    _, local, remote = runs
    assert local["kernel"] == 4.0
    assert remote["kernel"] == 4.0
