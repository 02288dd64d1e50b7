"""The CUDA 12 library API through the GPU client and server (docs/remote-gpu.md): a program loads
its kernels as a library, the way nvcc 12's runtime does, and computes on the stand-in driver behind
a GPU server; refused calls get the driver's error codes; a client that dies leaves no library
behind on the card."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.remote.remote_support import (
    Programs,
    build_client_program,
    build_programs,
    client,
    probe_env,
    running_server,
    token,
    wait_line,
)

LIBRARY_PROBE = Path(__file__).with_name("library_probe.c")
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_FOUND = 500

# Servers and programs started per case (seconds each): scripts/test-all runs them, plain pytest does not.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return build_programs(tmp_path_factory.mktemp("remote-programs"))


@pytest.fixture(scope="module")
def probe(programs: Programs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/remote/library_probe.c linked against libcuda.so (run with either directory first)."""
    return build_client_program(LIBRARY_PROBE, tmp_path_factory.mktemp("library-probe") / "library_probe", programs)


def run(probe: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([str(probe), *args], env=env, capture_output=True, text=True, timeout=60, check=False)
    return done.stdout.strip()


def endpoint(port: int) -> str:
    return f"127.0.0.1:{port}"


def test_a_library_computes_through_the_server(programs: Programs, probe: Path, tmp_path: Path) -> None:
    """Loaded through cuGetProcAddress's cuLibraryLoadData; the vector add launched through its
    CUkernel cast to CUfunction, the scale through cuKernelGetFunction; its global written and read
    back; its module's function found; after cuLibraryUnload its kernel is refused."""
    with running_server(programs, tmp_path, [client("a")]) as server:
        out = run(probe, probe_env(programs, endpoint(server.port), token("a")), "library", "100000")
    assert out == f"ok library 100000 c[99999]=149998 global 4096 after-unload {CUDA_ERROR_INVALID_HANDLE}"


def test_the_same_program_on_the_driver_itself(programs: Programs, probe: Path, tmp_path: Path) -> None:
    """The reference: the stand-in directly computes the same (it runs a stale kernel handle as a
    made-up one, computing nothing, where the server refuses it)."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(programs.standin), "GPUPOOL_STANDIN_STATE": str(tmp_path / "s"),
           "GPUPOOL_STANDIN_KERNEL_US": "1"}
    assert run(probe, env, "library", "100000").startswith("ok library 100000 c[99999]=149998 global 4096 ")
    assert run(probe, env, "refusals") == "refusals 200 400 400 500 500 400 400"


def test_a_library_from_a_file(programs: Programs, probe: Path, tmp_path: Path) -> None:
    image = tmp_path / "kernels.lib"
    image.write_text("gpupool-standin-module\nvector_add\nscale\n")
    with running_server(programs, tmp_path, [client("a")]) as server:
        env = probe_env(programs, endpoint(server.port), token("a"))
        out = run(probe, env, "file", str(image), "1000")
        missing = run(probe, env, "file", str(tmp_path / "none.lib"), "10")
    assert out == "ok file 1000 c[999]=1498.5"
    assert missing.startswith("error 301 at cuLibraryLoadFromFile")  # CUDA_ERROR_FILE_NOT_FOUND, on the client


def test_refusals_have_the_drivers_codes(programs: Programs, probe: Path, tmp_path: Path) -> None:
    """A bad image (the driver's 200), a made-up library and kernel (400, the server's check before
    the driver), a kernel and a global the library lacks (the driver's 500), a library's module
    unloaded on its own and a library unloaded twice (400)."""
    with running_server(programs, tmp_path, [client("a")]) as server:
        out = run(probe, probe_env(programs, endpoint(server.port), token("a")), "refusals")
    i, n = CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_NOT_FOUND
    assert out == f"refusals {CUDA_ERROR_INVALID_IMAGE} {i} {i} {n} {n} {i} {i}"


def test_a_dead_clients_library_is_freed(programs: Programs, probe: Path, tmp_path: Path) -> None:
    """Two clients of a 300 MiB card: a library holding a 200 MiB global keeps the second from
    200 MiB until its client is killed; its server process ends and the card's memory comes back."""
    with running_server(programs, tmp_path, [client("a"), client("b")], card_mib=300) as server:
        holder = subprocess.Popen([str(probe), "hold", "200"], stdout=subprocess.PIPE, text=True,
                                  env=probe_env(programs, endpoint(server.port), token("a")))
        env_b = probe_env(programs, endpoint(server.port), token("b"))
        try:
            assert wait_line(holder, 30) == "held 200"
            assert run(programs.probe, env_b, "alloc", "200").startswith(f"alloc {CUDA_ERROR_OUT_OF_MEMORY} ")
        finally:
            holder.kill()
            holder.wait()
        deadline = time.monotonic() + 10
        while (out := run(programs.probe, env_b, "alloc", "200")).startswith("alloc 2 ") \
                and time.monotonic() < deadline:
            time.sleep(0.1)
    assert out.startswith("alloc 0 ")
