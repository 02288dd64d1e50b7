"""What a CUDA 12 runtime asks before it launches, through the GPU client and server
(docs/remote-gpu.md, "What is forwarded"): function and kernel attributes, cache preferences,
occupancy (the block-size callback's answers carried with the call), module globals. Each is
answered by the server's driver (the stand-in) as the driver answers the program directly; a
module's global is not counted against the client's share; managed variables stay refused."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
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
)

ATTRIBUTES_PROBE = Path(__file__).with_name("attributes_probe.c")
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_SUPPORTED = 801

# A server and programs started per case (seconds each): scripts/test-all runs them, plain pytest does not.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return build_programs(tmp_path_factory.mktemp("remote-programs"))


@pytest.fixture(scope="module")
def probe(programs: Programs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = tmp_path_factory.mktemp("attributes-probe") / "attributes_probe"
    return build_client_program(ATTRIBUTES_PROBE, built, programs)


def run(probe: Path, env: dict[str, str], mode: str) -> str:
    done = subprocess.run([str(probe), mode], env=env, capture_output=True, text=True, timeout=60, check=False)
    return done.stdout.strip()


def direct(programs: Programs, probe: Path, state: Path, mode: str) -> str:
    """The probe on the stand-in driver itself: the answers a program gets without the network."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(programs.standin), "GPUPOOL_STANDIN_STATE": str(state)}
    return run(probe, env, mode)


def remote(programs: Programs, probe: Path, workdir: Path, *modes: str, extra: Sequence[str] = ()) -> list[str]:
    with running_server(programs, workdir, [client("a")], extra=extra) as server:
        env = probe_env(programs, f"127.0.0.1:{server.port}", token("a"))
        return [run(probe, env, mode) for mode in modes]


@pytest.mark.parametrize("extra", [[], ["--enforce-compute"]], ids=["direct", "executor"])
def test_attributes_and_occupancy_are_the_drivers(programs: Programs, probe: Path, tmp_path: Path,
                                                  extra: list[str]) -> None:
    """Every answer through the server equals the driver's own, errors included: a too-large dynamic
    shared size and a bad cache preference (the driver's 1), a made-up function (400, the server's
    check), bad occupancy flags; the block-size callback gives the size the driver picks with it.
    The same under --enforce-compute, where the interception library sits between server and driver."""
    modes = ("attributes", "occupancy", "globals")
    through = remote(programs, probe, tmp_path, *modes, extra=extra)
    local = [direct(programs, probe, tmp_path / "direct.state", mode) for mode in modes]
    assert through == local
    attributes, occupancy, globals = through
    v, h = CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_HANDLE
    # max threads, registers (32, 64), dynamic shared 48 KiB raised to 64 KiB, 70000 refused, carveout
    # set and read, cache preference 1 taken and 7 refused; a kernel's registers (cast and asked as a
    # kernel), its carveout set and read, its cache preference; a made-up function
    assert attributes == (f"attributes 0:1024 0:32 0:64 0:49152 0:0 0:65536 {v} 0:0 0:50 0:0 {v} 0:64 0:64 0:0 0:25 "
                          f"0:0 {h}")
    # blocks per SM: 8, 4 (registers), 3 (shared memory), 0 (past the function's limit), 8, bad flags;
    # best grid*10000+block: 1024 in 2 blocks x 8 SMs; with 48 bytes a thread 672 (2 x 8), under a
    # limit of 500 448 (3 x 8); scale with 16 KiB, registers bound: 1024; 48 bytes a thread under a
    # limit of 256, found through cuGetProcAddress: 224 (6 x 8)
    assert occupancy == f"occupancy 0:8 0:4 0:3 0:0 0:8 {v} 0:161024 0:160672 0:240448 0:81024 0:480224"
    assert globals == f"globals 256 same library 4096 same missing {CUDA_ERROR_NOT_FOUND} 0"


def test_a_modules_global_is_not_the_clients_allocation(programs: Programs, probe: Path, tmp_path: Path) -> None:
    """A module holding a 100 MiB global leaves the share's free memory as it was (the global is the
    module's, as the driver's own code and data are), cuMemFree refuses its pointer, it goes with
    its module (400 after cuModuleUnload), and cuLibraryGetManaged is refused."""
    (accounting,) = remote(programs, probe, tmp_path, "accounting")
    share = 256 << 20
    assert accounting == (f"accounting {share} {share} {CUDA_ERROR_INVALID_VALUE} {CUDA_ERROR_INVALID_HANDLE} "
                          f"{CUDA_ERROR_NOT_SUPPORTED}")
