"""A remote-share pod whose share turned out local, run with the real dynamic loader.

The pod-scheduler webhook sets ``LD_PRELOAD=/var/run/gpupool-remote/lib/libcuda.so.1:
/var/run/gpupool-remote/lib/libcudart.so.12`` (the GPU client, gpupool's CUDA runtime) at admission,
before the bind decides where the share is (gpupool/extender/remote_injection.py). On a local share
the init container (``gpupool remote-gpu install-client`` with an empty share) now puts the
local-share placeholder at both: every program starts without the loader's "cannot be preloaded"
line, the program's ``libcuda.so.1`` is still the node's driver, and the node's interception
library (``/etc/ld.so.preload`` in a container, loaded after ``LD_PRELOAD``; here second in
``LD_PRELOAD``, the same order) limits it exactly as without the placeholder.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli.remote_gpu_cmd import remote_gpu
from gpupool.shim.build import ShimBuildError, find_compiler
from gpupool.shim.remote_build import PLACEHOLDER_NAME
from tests.shim.toolchain import Toolchain, codes, run_probe

LOADER_LINE = "cannot be preloaded"
OK, OUT_OF_MEMORY = 0, 2
GIB = 1 << 30
CARD_BYTES = 16 * GIB  # the stand-in driver's default card


@pytest.fixture(scope="module")
def pod_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the init container leaves at the preloaded path for a local share (the real command,
    the placeholder built by the project's C build as the image's ``remote-gpu build`` does)."""
    try:
        find_compiler()
    except ShimBuildError as exc:
        pytest.skip(f"cannot build the placeholder here: {exc}")
    root = tmp_path_factory.mktemp("pod")
    into, grant = root / "lib", root / "grant"
    done = CliRunner().invoke(remote_gpu, ["install-client", "--into", str(into), "--grant", str(grant), "--wait", "0"],
                              env={"GPUPOOL_REMOTE_SHARE": ""})
    assert done.exit_code == 0, done.output
    assert "installed the local-share placeholder" in done.output
    return into / "libcuda.so.1"


@pytest.fixture(scope="module")
def pod_preload(pod_library: Path) -> str:
    """The webhook's LD_PRELOAD, with the init container's files at its paths (the placeholder at all four)."""
    runtime, blas = pod_library.with_name("libcudart.so.12"), pod_library.with_name("libcublas.so.12")
    blas_lt = pod_library.with_name("libcublasLt.so.12")
    assert runtime.read_bytes() == pod_library.read_bytes() == blas.read_bytes() == blas_lt.read_bytes()
    return f"{pod_library}:{runtime}:{blas}:{blas_lt}"


def run(program: list[str], preload: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(program, env={"PATH": "/usr/bin:/bin", "LD_PRELOAD": preload}, capture_output=True,
                          text=True, timeout=60, check=False)


def test_programs_start_without_the_loaders_line(pod_preload: str, tmp_path: Path) -> None:
    shell = ["/bin/sh", "-c", "/bin/true && /bin/echo started"]
    missing = run(shell, str(tmp_path / "empty" / "libcuda.so.1"))  # what a local share got before
    assert missing.stderr.count(LOADER_LINE) == 3  # the shell, true and echo: one line per program
    placeholder = run(shell, pod_preload)
    assert (placeholder.returncode, placeholder.stdout, placeholder.stderr) == (0, "started\n", "")


def test_the_placeholder_is_never_the_programs_libcuda(pod_library: Path) -> None:
    """It carries the driver's file name in the pod: its soname must differ and it must define
    nothing, or the loader would answer the program's libcuda.so.1 with it."""
    if shutil.which("readelf") is None:
        pytest.skip("no readelf")
    dynamic = subprocess.run(["readelf", "-d", "--dyn-syms", "-W", str(pod_library)], capture_output=True,
                             text=True, check=True).stdout
    assert f"Library soname: [{PLACEHOLDER_NAME}]" in dynamic and "(NEEDED)" not in dynamic
    defined = [line.split()[-1] for line in dynamic.splitlines()
               if len(line.split()) >= 8 and line.split()[6] != "UND" and line.split()[3] in ("FUNC", "OBJECT")]
    assert defined == []


@pytest.mark.parametrize("mode", ["symbol", "dlsym", "procaddress"])
def test_the_nodes_driver_still_serves_the_program(plain: Toolchain, tmp_path: Path, pod_preload: str,
                                                   mode: str) -> None:
    """No interception library: the stand-in driver (the node's) answers, linked, dlopened or
    through cuGetProcAddress."""
    env = {**plain.env(tmp_path), "LD_PRELOAD": pod_preload}
    steps, stderr = run_probe(plain, env, mode, "alloc:3g", "total")
    assert codes(steps) == [OK, OK] and steps[1].values == (str(CARD_BYTES),)
    assert LOADER_LINE not in stderr


@pytest.mark.parametrize("mode", ["symbol", "dlsym", "procaddress"])
def test_the_interception_library_limits_as_before(plain: Toolchain, tmp_path: Path, pod_preload: str,
                                                   mode: str) -> None:
    program = ("alloc:3g", "alloc:2g", "alloc:1g", "alloc:1", "info", "total")
    alone, _ = run_probe(plain, plain.env(tmp_path, GPUPOOL_MEMORY_LIMIT_MIB="4096"), mode, *program)
    (tmp_path / "pod").mkdir()  # a card and container directory of its own
    env = plain.env(tmp_path / "pod", GPUPOOL_MEMORY_LIMIT_MIB="4096")
    behind, stderr = run_probe(plain, {**env, "LD_PRELOAD": f"{pod_preload} {plain.preload}"}, mode, *program)
    assert codes(behind) == [OK, OUT_OF_MEMORY, OK, OUT_OF_MEMORY, OK, OK]
    assert behind == alone and behind[-1].values == (str(4 * GIB),)
    assert LOADER_LINE not in stderr
