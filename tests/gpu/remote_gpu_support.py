"""Helpers of the GPU tests of remote GPUs: NVIDIA's libraries on this machine, and the GPU server on
NVIDIA's driver for the first card."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from gpupool.api.remote_gpu import RemoteClient, encode_clients
from gpupool.shim.build import ShimBuildError, find_compiler
from tests.remote.remote_support import SERVE, start_serve

REPO = Path(__file__).resolve().parents[2]
WHEEL_DIRS = {"libcublas.so.12": ("nvidia", "cublas", "lib"), "libcudart.so.12": ("nvidia", "cuda_runtime", "lib")}
"""Where NVIDIA's pip wheels put a library under site-packages (PyTorch's CUDA wheels depend on them)."""
WHEELS = {"libcublas.so.12": "nvidia-cublas-cu12", "libcudart.so.12": "nvidia-cuda-runtime-cu12"}
"""The pip wheel that holds each of WHEEL_DIRS' libraries, for skip reasons."""


def nvidia_library(soname: str) -> Path | None:
    """NVIDIA's ``soname``: the one ldconfig knows, else a wheel's in site-packages."""
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    for line in listing.splitlines():
        if line.strip().startswith(f"{soname} ") and "=>" in line:
            return Path(line.split("=>")[1].strip())
    for directory in sys.path:
        candidate = Path(directory, *WHEEL_DIRS.get(soname, ("-",)), soname)
        if candidate.is_file():
            return candidate
    return None


def why_not_serve(*libraries: str) -> str | None:
    """Why this machine, its GPU present, cannot run ``serving_first_card`` and a compiled program on
    NVIDIA's ``libraries`` (sonames of WHEELS): NVIDIA's driver library, nvidia-smi, one of the
    libraries or a C compiler missing; None when nothing is."""
    if nvidia_library("libcuda.so.1") is None:
        return "no libcuda.so.1 (NVIDIA's driver library) found by ldconfig"
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found (the card's UUID is read with it)"
    for soname in libraries:
        if nvidia_library(soname) is None:
            return f"no NVIDIA {soname} (neither ldconfig nor the {WHEELS[soname]} wheel in site-packages has one)"
    try:
        find_compiler()
    except ShimBuildError as exc:
        return f"no C compiler: {exc}"
    return None


def first_card_uuid() -> str:
    return subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()


@contextmanager
def serving_first_card(workdir: Path, token: str, pod: str, memory_mib: int = 8192,
                       env: Mapping[str, str] | None = None) -> Iterator[int]:
    """``gpupool remote-gpu serve`` on NVIDIA's driver for one client of the first card, on loopback;
    yields its port, kills its session at the end."""
    driver = nvidia_library("libcuda.so.1")
    assert driver is not None, "no libcuda.so.1"
    clients = workdir / "clients.json"
    clients.write_text(encode_clients([RemoteClient(token, pod, first_card_uuid(), memory_mib, 0)]))
    command = [*SERVE, "--listen", "127.0.0.1:0", "--clients", str(clients), "--driver", str(driver)]
    process, port, _ = start_serve(command, {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=180)
    try:
        yield port
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
