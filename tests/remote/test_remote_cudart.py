"""NVIDIA's CUDA runtime (libcudart 12.9, from the nvidia-cuda-runtime-cu12 wheel of the dev extra)
through the GPU client and a server on the stand-in driver (docs/remote-gpu.md, "NVIDIA's CUDA
runtime"): the runtime reads the server's driver version, then asks for the driver's private export
tables, which the client cannot forward; every runtime call then fails with cudaErrorNotSupported,
cleanly (no crash, no hang), and the client says why on stderr. GPUPOOL_REMOTE_TRACE=1 names what
was looked up, refused and called."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.shim.build import find_compiler
from gpupool.shim.remote_build import build_client
from tests.remote.remote_support import Programs, build_programs, client, running_server, token
from tests.remote.remote_support import probe_env as client_env

CUDART_PACKAGE = "nvidia-cuda-runtime-cu12"
CUDART_VERSION = "12.9.79"
"""The wheel the dev extra pins: what the expectations below were measured with."""
PROBE_SOURCE = Path(__file__).with_name("cudart_probe.c")
HEADER_SHIM = Path(__file__).with_name("cudart_headers")
CUDA_SUCCESS = 0
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_MODULE_LAZY_LOADING = 2
CUDA_ERROR_NOT_SUPPORTED_NAME = "cudaErrorNotSupported"
STANDIN_DRIVER_VERSION = 12080
#: The first table the runtime asks for; the six others follow in the trace.
FIRST_TABLE = "f8cff951-2146-8b4e-b9e2-fb469e7c0dd9"
RUNTIME_CALLS = ("getDeviceCount", "setDevice", "free0", "getDeviceProperties", "malloc", "memcpyToDevice",
                 "memcpyToHost", "memset", "memGetInfo", "streamCreate", "eventCreate", "eventRecord",
                 "eventCreate2", "eventRecord2", "eventSynchronize", "eventElapsedTime", "streamSynchronize",
                 "streamDestroy", "deviceSynchronize", "mallocHost", "freeHost", "free", "getLastError")


def cudart_dir() -> Path:
    """The wheel's directory (lib/libcudart.so.12, include/), or a skip saying what is missing."""
    try:
        installed = importlib.metadata.version(CUDART_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{CUDART_PACKAGE} is not installed (the dev extra brings it: pip install -e .[dev])")
    if installed != CUDART_VERSION:
        pytest.skip(f"{CUDART_PACKAGE} {installed} is installed; these expectations are of {CUDART_VERSION}")
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    assert spec is not None and spec.submodule_search_locations is not None
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return build_programs(tmp_path_factory.mktemp("remote-programs"))


@pytest.fixture(scope="module")
def driver_only(programs: Programs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding only the GPU client as libcuda.so.1: the client's own directory also holds
    gpupool's libcudart.so.12, which LD_LIBRARY_PATH would put before the wheel's (the probe's
    -rpath is a RUNPATH, searched after it); these tests are of NVIDIA's runtime."""
    directory = tmp_path_factory.mktemp("driver-only")
    (directory / "libcuda.so.1").symlink_to(programs.client / "libcuda.so.1")
    return directory


@pytest.fixture()
def probe_env(programs: Programs, driver_only: Path) -> Callable[..., dict[str, str]]:
    def env(_: Programs, endpoint: str, secret: str) -> dict[str, str]:
        return {**client_env(programs, endpoint, secret), "LD_LIBRARY_PATH": str(driver_only)}
    return env


def build_probe(out: Path, *, static: bool) -> Path:
    """cudart_probe.c compiled against the wheel's headers and linked to its libcudart.so.12, or with
    ``static`` to its libcudart_static.a (what nvcc links by default)."""
    runtime = cudart_dir() / "lib"
    link = [str(runtime / "libcudart_static.a"), "-lstdc++", "-lrt", "-ldl", "-lpthread"] if static else \
        [str(runtime / "libcudart.so.12"), f"-Wl,-rpath,{runtime}"]
    subprocess.run([*find_compiler(), "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-o", str(out),
                    str(PROBE_SOURCE), f"-I{HEADER_SHIM}", f"-I{runtime.parent / 'include'}", *link],
                   check=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_probe(tmp_path_factory.mktemp("cudart-probe") / "cudart_probe", static=False)


@pytest.fixture(scope="module", params=["shared", "static"])
def any_probe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probe on the shared runtime, and on the static one."""
    out = tmp_path_factory.mktemp("cudart-probe") / f"cudart_probe_{request.param}"
    return build_probe(out, static=request.param == "static")


def run(probe: Path, env: dict[str, str], command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(probe), command], env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.slow
def test_the_runtime_reads_the_servers_driver_version(programs: Programs, probe: Path, tmp_path: Path,
                                                      probe_env: Callable[..., dict[str, str]]) -> None:
    """cudaDriverGetVersion is answered by the server's driver: the runtime asks the driver's version
    before cuInit, which the client now answers by connecting (before, the runtime read version 0
    and every call failed with cudaErrorInsufficientDriver, 35)."""
    with running_server(programs, tmp_path, [client("a")]) as server:
        done = run(probe, probe_env(programs, f"127.0.0.1:{server.port}", token("a")), "version")
    assert done.stdout.strip() == f"version driver {CUDA_SUCCESS} {STANDIN_DRIVER_VERSION} runtime {CUDA_SUCCESS} 12090"


@pytest.mark.slow
def test_the_runtime_cannot_start_through_the_client(programs: Programs, any_probe: Path, tmp_path: Path,
                                                     probe_env: Callable[..., dict[str, str]]) -> None:
    """Every call a program makes first fails with cudaErrorNotSupported (801), on the shared and
    the static runtime; the program ends normally, and the client's one line on stderr names the
    refused table and says why."""
    with running_server(programs, tmp_path, [client("a")]) as server:
        done = run(any_probe, probe_env(programs, f"127.0.0.1:{server.port}", token("a")), "calls")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "calls " + " ".join(f"{name}={CUDA_ERROR_NOT_SUPPORTED}" for name in RUNTIME_CALLS),
        "values -1 0",
    ]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"gpupool remote GPU: cuGetExportTable({FIRST_TABLE}) refused: the driver's private "
                               "tables cannot be forwarded to a GPU server")
    assert CUDA_ERROR_NOT_SUPPORTED_NAME in lines[0]


@pytest.mark.slow
def test_the_trace_shows_the_runtimes_lookups_and_tables(programs: Programs, probe: Path, tmp_path: Path,
                                                        probe_env: Callable[..., dict[str, str]]) -> None:
    """With GPUPOOL_REMOTE_TRACE=1: every name the runtime looked up, forwarded or not, and each
    export table refused, in the order asked."""
    with running_server(programs, tmp_path, [client("a")]) as server:
        env = {**probe_env(programs, f"127.0.0.1:{server.port}", token("a")), "GPUPOOL_REMOTE_TRACE": "1"}
        done = run(probe, env, "calls")
    lines = done.stderr.splitlines()
    looked_up = {line.split()[5]: line.endswith(": forwarded") for line in lines if " looked up " in line}
    assert looked_up["cuMemAlloc"] and looked_up["cuLaunchKernel"] and looked_up["cuLibraryLoadData"]
    assert not looked_up["cuMemAllocManaged"] and not looked_up["cuGraphLaunch"]
    assert len(looked_up) > 300  # names, each once or with its per-thread-stream variant
    tables = [line.split("(")[1].split(")")[0] for line in lines if "cuGetExportTable(" in line]
    assert tables == [FIRST_TABLE, "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"]  # it stops at the first it needs


CLIENT_CALLS = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
def lookup(name):
    found = ctypes.c_void_p()
    assert lib.cuGetProcAddress_v2(name.encode(), ctypes.byref(found), 12090, 0, None) == 0
    return found.value
def entry(name, *types):
    return ctypes.CFUNCTYPE(ctypes.c_int, *types)(lookup(name))
mode = ctypes.c_int(-1)
print("mode", entry("cuModuleGetLoadingMode", ctypes.c_void_p)(ctypes.byref(mode)), mode.value)
managed = entry("cuMemAllocManaged", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint)
print("managed", managed(None, 0x100, 1), managed(None, 0x200, 1))
print("made-up", entry("cuMadeUpForTheTest", ctypes.c_void_p)(None))
print("stubs", lookup("cuMemAllocManaged") == lookup("cuMemAllocManaged") != lookup("cuMadeUpForTheTest"))
print("table", lib.cuGetExportTable(ctypes.byref(ctypes.c_void_p()), bytes(range(16))))
"""


def test_refused_calls_are_named_in_the_trace() -> None:
    """Without a server: cuModuleGetLoadingMode answered by the client (LAZY), and with
    GPUPOOL_REMOTE_TRACE=1 each refused entry point got through cuGetProcAddress names itself and
    its first arguments when called (the same stub for every lookup of a name)."""
    library = build_client(werror=True) / "libcuda.so.1"  # never connects: no grant read
    done = subprocess.run([sys.executable, "-c", CLIENT_CALLS, str(library)], capture_output=True, text=True,
                          timeout=60, check=True, env={**os.environ, "GPUPOOL_REMOTE_TRACE": "1"})
    assert done.stdout.splitlines() == [
        f"mode {CUDA_SUCCESS} {CUDA_MODULE_LAZY_LOADING}",
        f"managed {CUDA_ERROR_NOT_SUPPORTED} {CUDA_ERROR_NOT_SUPPORTED}",
        f"made-up {CUDA_ERROR_NOT_SUPPORTED}",
        "stubs True",
        f"table {CUDA_ERROR_NOT_SUPPORTED}",
    ]
    called = [line for line in done.stderr.splitlines() if " called " in line]
    assert called[0].startswith("gpupool remote GPU: called cuMemAllocManaged(0, 0x100, 0x1, ")
    assert called[1].startswith("gpupool remote GPU: called cuMemAllocManaged(0, 0x200, 0x1, ")
    assert called[2].startswith("gpupool remote GPU: called cuMadeUpForTheTest(0, ")
    assert all(line.endswith("not forwarded: CUDA_ERROR_NOT_SUPPORTED") for line in called)
    assert "cuGetExportTable(00010203-0405-0607-0809-0a0b0c0d0e0f) refused: " in done.stderr
