"""gpupool's CUDA runtime (gpupool/shim/src/remote/cudart.c, a libcudart.so.12 on the driver API)
with the GPU client and a server on the stand-in driver (docs/remote-gpu.md, "NVIDIA's CUDA runtime
(libcudart)"): programs compiled against the nvidia-cuda-runtime-cu12 wheel's headers (NVIDIA's
ABI) and linked to gpupool's runtime count, query, allocate, copy both ways, set, time and launch
kernels registered as nvcc's host code registers them, with the data read back and checked; a call
outside the subset fails with cudaErrorNotSupported and one stderr line naming it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpupool.shim.build import find_compiler
from gpupool.shim.remote_build import RUNTIME_SONAME
from tests.remote.remote_support import Programs, build_programs, client, probe_env, running_server, token
from tests.remote.test_remote_cudart import HEADER_SHIM, RUNTIME_CALLS, cudart_dir

RUNTIME_PROBE = Path(__file__).with_name("runtime_probe.c")
CUDART_PROBE = Path(__file__).with_name("cudart_probe.c")
CUDA_SUCCESS = 0
NOT_SUPPORTED = 801
INVALID_MEMCPY_DIRECTION = 21
INVALID_DEVICE_FUNCTION = 98
INVALID_VALUE = 1
MISSING_CONFIGURATION = 52
STANDIN_DRIVER_VERSION = 12080
RUNTIME_VERSION = 12090
SHARE_MIB = 256


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return build_programs(tmp_path_factory.mktemp("remote-programs"))


def link_to_gpupools_runtime(source: Path, out: Path, programs: Programs) -> Path:
    """``source`` compiled against the wheel's headers and linked to gpupool's libcudart.so.12 by
    ``-lcudart`` (the GPU client's directory, which also holds the client as libcuda.so.1)."""
    include = cudart_dir() / "include"
    runtime = programs.client / RUNTIME_SONAME
    assert runtime.is_file(), f"gpupool's runtime was not built beside the client: {runtime}"
    subprocess.run([*find_compiler(), "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-o", str(out), str(source),
                    f"-I{HEADER_SHIM}", f"-I{include}", f"-L{programs.client}", "-lcudart",
                    f"-Wl,-rpath-link,{programs.client}", f"-Wl,-rpath,{programs.client}"], check=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def runtime_probe(programs: Programs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return link_to_gpupools_runtime(RUNTIME_PROBE, tmp_path_factory.mktemp("runtime") / "runtime_probe", programs)


@pytest.fixture(scope="module")
def cudart_probe(programs: Programs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/remote/cudart_probe.c, the program NVIDIA's runtime fails (test_remote_cudart.py), on
    gpupool's runtime."""
    return link_to_gpupools_runtime(CUDART_PROBE, tmp_path_factory.mktemp("runtime") / "cudart_probe", programs)


def run(programs: Programs, probe: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = probe_env(programs, f"127.0.0.1:{port}", token("a"))
    return subprocess.run([str(probe), *args], env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.slow
def test_the_programs_first_calls_all_succeed(programs: Programs, cudart_probe: Path, tmp_path: Path) -> None:
    """The calls that fail with cudaErrorNotSupported on NVIDIA's runtime (device count, context,
    properties, malloc, copies both ways with the bytes read back, memset, memory info, a stream,
    events and their elapsed time, synchronisation, page-locked memory, free) all succeed, and the
    versions are the server driver's and this runtime's; nothing on stderr."""
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        calls = run(programs, cudart_probe, server.port, "calls")
        version = run(programs, cudart_probe, server.port, "version")
    assert calls.returncode == 0, calls.stderr
    assert calls.stdout.splitlines() == ["calls " + " ".join(f"{name}={CUDA_SUCCESS}" for name in RUNTIME_CALLS),
                                         "values 1 1"]
    assert calls.stderr == ""
    assert version.stdout.strip() == (f"version driver {CUDA_SUCCESS} {STANDIN_DRIVER_VERSION} "
                                      f"runtime {CUDA_SUCCESS} {RUNTIME_VERSION}")


@pytest.mark.slow
def test_properties_come_from_the_servers_driver(programs: Programs, runtime_probe: Path, tmp_path: Path) -> None:
    """cudaGetDeviceProperties in NVIDIA's struct layout: the card's name, the booked share as
    totalGlobalMem, and the attributes the stand-in answers (compute capability 8.0, 8
    multiprocessors, 1024 threads per block); mapped host memory and managed memory, which the card
    has (the stand-in says 1) and this runtime refuses, are 0 in the properties and by attribute."""
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        done = run(programs, runtime_probe, server.port, "properties")
    assert done.returncode == 0, done.stderr
    count, device, total, capability, processors, threads, refused, name = done.stdout.strip().split(maxsplit=8)[1:]
    assert (count, device, capability, processors, threads) == ("1", "0", "8.0", "8", "1024")
    assert refused == "refused=0,0,0,0,0"
    assert int(total) == SHARE_MIB << 20 and name == "gpupool stand-in device 0"


@pytest.mark.slow
def test_copies_of_every_kind_and_memsets_keep_the_data(programs: Programs, runtime_probe: Path,
                                                        tmp_path: Path) -> None:
    """Host to device and back, device to device, host to host, cudaMemcpyDefault (the direction from
    the pointers, one into the middle of an allocation), async copies and a memset on a stream into
    page-locked memory, memsets of all and part of an allocation: each read back and compared. A
    bad direction is cudaErrorInvalidMemcpyDirection, kept for cudaGetLastError, which clears it."""
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        done = run(programs, runtime_probe, server.port, "copies")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["copies", "htod_dtoh=1", "dtod=1", "htoh=1", "default=1", "async=1", "memset=1",
                                   f"direction={INVALID_MEMCPY_DIRECTION}", f"last={INVALID_MEMCPY_DIRECTION}",
                                   "cleared=0", "freed=1"]


@pytest.mark.slow
def test_kernels_registered_as_nvcc_registers_them_run(programs: Programs, runtime_probe: Path,
                                                       tmp_path: Path) -> None:
    """A fatbin wrapper (magic 0x466243b1) and its kernels registered by their host stubs' addresses,
    launched by cudaLaunchKernel (the second through nvcc's push/pop of the <<<>>> configuration):
    the module is loaded on the server at the first launch, each kernel's parameters laid out as the
    server's driver says, and the results read back: c = (a + b) * 0.5."""
    n = 10000
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        done = run(programs, runtime_probe, server.port, "kernel", str(n))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"kernel {CUDA_SUCCESS} c[{n - 1}]={1.5 * (n - 1):g} ok=1"


@pytest.mark.slow
def test_a_kernel_launched_by_its_handle_as_newer_nvcc_code_does_runs(programs: Programs, runtime_probe: Path,
                                                                      tmp_path: Path) -> None:
    """Newer nvcc host code asks a kernel's handle once (__cudaGetKernel) and launches by it
    (__cudaLaunchKernel) after popping the configuration: c = a + a read back. An unregistered host
    function has no handle (98)."""
    n = 5000
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        done = run(programs, runtime_probe, server.port, "handle", str(n))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"handle {CUDA_SUCCESS} c[{n - 1}]={2.0 * (n - 1):g} ok=1 "
                                   f"unknown={INVALID_DEVICE_FUNCTION}")


@pytest.mark.slow
def test_device_variables_are_copied_to_and_from_by_their_host_shadows(programs: Programs, runtime_probe: Path,
                                                                       tmp_path: Path) -> None:
    """__cudaRegisterVar (no refusal line any more), then the symbol calls on the module's global:
    its size, host to device and back at an offset, its address copied from with cudaMemcpyDefault
    (a device pointer), a device-to-device async copy into it; past its end is
    cudaErrorInvalidValue, an unregistered shadow and a variable the image lacks
    cudaErrorInvalidSymbol (13)."""
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        done = run(programs, runtime_probe, server.port, "symbols")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["symbols", "size=64", "to=0", "from=1", "address=1", "dtod=1", "bounds=1",
                                   "unknown=13", "missing=13"]
    assert done.stderr == ""


@pytest.mark.slow
def test_function_attributes_and_occupancy_are_the_servers_drivers(programs: Programs, runtime_probe: Path,
                                                                   tmp_path: Path) -> None:
    """What CUB and Thrust ask of their kernels: cudaFuncGetAttributes in NVIDIA's struct layout (the
    stand-in's 1024 threads per block, 32 and 64 registers, PTX and binary version 80), a dynamic
    shared memory limit set and read back, a cache preference, blocks per multiprocessor at 256
    threads (the stand-in's card: 8 by its threads and vector_add's registers, 4 by scale's); an
    unregistered function is 98."""
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        done = run(programs, runtime_probe, server.port, "functions")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["functions", "add=1024,32,80,80", "scale=64", "shared=0,40000", "cache=0",
                                   "occupancy=8,4", f"unknown={INVALID_DEVICE_FUNCTION}"]


@pytest.mark.slow
def test_a_device_reset_frees_the_memory_and_reloads_modules(programs: Programs, runtime_probe: Path,
                                                             tmp_path: Path) -> None:
    """cudaDeviceReset (what sample programs end with): the share's free memory is back to what it
    was before the program's cudaMalloc, and a launch after it loads its module again and computes.
    Stream priorities are not carried: the range is [0, 0]."""
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        done = run(programs, runtime_probe, server.port, "reset")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"reset {CUDA_SUCCESS} freed=1 again=1 priorities={CUDA_SUCCESS},0,0"


@pytest.mark.slow
def test_an_unregistered_kernel_and_a_call_outside_the_subset_fail_cleanly(programs: Programs, runtime_probe: Path,
                                                                          tmp_path: Path) -> None:
    """A launch of a host function never registered is cudaErrorInvalidDeviceFunction; a function of
    NVIDIA's runtime this one does not carry (cudaMallocManaged) returns cudaErrorNotSupported each
    time, with one line on stderr naming it."""
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        unknown = run(programs, runtime_probe, server.port, "unknown")
        refused = run(programs, runtime_probe, server.port, "refused")
    assert unknown.stdout.strip() == f"unknown {INVALID_DEVICE_FUNCTION} cudaErrorInvalidDeviceFunction"
    assert refused.returncode == 0, refused.stderr
    assert refused.stdout.strip() == f"refused {NOT_SUPPORTED} {NOT_SUPPORTED} {NOT_SUPPORTED} cudaErrorNotSupported"
    assert refused.stderr.splitlines() == [
        "gpupool CUDA runtime: cudaMallocManaged is not carried to the GPU: cudaErrorNotSupported"]


@pytest.mark.slow
def test_what_pytorch_asks_before_its_first_kernel(programs: Programs, runtime_probe: Path, tmp_path: Path) -> None:
    """The calls PyTorch 2.8 makes beside the common ones (docs/remote-gpu.md, "PyTorch"; its first
    CUDA call, torch.cuda.get_device_properties, stopped on cudaStreamIsCapturing): no stream is
    ever capturing (capture is refused), by cudaStreamIsCapturing and each form of
    cudaStreamGetCaptureInfo, their other outputs zeroed; the thread's capture mode is exchanged
    (Global, then the Relaxed given back) and a bad one is cudaErrorInvalidValue; a stream's priority
    is 0; driver entry points are the client's: cuMemGetInfo's gives the share's total, a call the
    client does not carry is found and returns CUDA_ERROR_NOT_SUPPORTED. Nothing on stderr."""
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        done = run(programs, runtime_probe, server.port, "pytorch")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "pytorch", "capturing=0,0,0,0", "info=0,0,0,1,1,0", "old=0,0,0", "v3=0,0,1",
        f"mode=0,0,0,2,{INVALID_VALUE}", "priority=0,0", f"entry=0,0,0,{SHARE_MIB}", "byversion=0,0,0",
        f"refused=0,0,{NOT_SUPPORTED}"]
    assert done.stderr == ""


def test_pointer_attributes_come_from_the_runtimes_records(programs: Programs, runtime_probe: Path,
                                                          tmp_path: Path) -> None:
    """cudaPointerGetAttributes (PyTorch's Tensor.is_pinned and pinned-memory checks ask it) answers
    every pointer, field by field, as NVIDIA's CUDA 12 runtime does where this runtime can know:
    inside a cudaMalloc allocation or a registered variable on device 0, device memory of device 0
    (devicePointer the pointer, hostPointer NULL); inside cudaMallocHost or cudaHostAlloc memory,
    host memory of the device current then (hostPointer the pointer, devicePointer NULL: mapped host
    memory is refused); heap, stack and freed memory unregistered (device cudaInvalidDeviceId -2,
    hostPointer the pointer, devicePointer NULL) with cudaSuccess; NULL attributes
    cudaErrorInvalidValue. Refused before (801 for each). Nothing on stderr."""
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        done = run(programs, runtime_probe, server.port, "pointers")
    assert done.returncode == 0, done.stderr
    device, host, unregistered = "0,2,0,p,null", "0,1,0,null,p", "0,0,-2,null,p"
    assert done.stdout.split() == [
        "pointers", f"device={device}", f"inside={device}", f"pinned={host}", f"hostalloc={host}",
        f"variable={device}", f"heap={unregistered}", f"stack={unregistered}", f"freedhost={unregistered}",
        f"freed={unregistered}", f"nullattributes={INVALID_VALUE}"]
    assert done.stderr == ""


def test_hostile_sizes_and_a_wrapper_without_data_are_refused(programs: Programs, runtime_probe: Path,
                                                              tmp_path: Path) -> None:
    """A launch asking more dynamic shared memory than the driver's 32-bit parameter holds is
    cudaErrorInvalidValue (cut to 32 bits, 4 GiB was 0 and the launch went ahead); a fatbin wrapper
    whose data is NULL registers, its launch fails with cudaErrorInvalidValue and it unregisters
    without a crash; a pop with nothing pushed is cudaErrorMissingConfiguration."""
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        done = run(programs, runtime_probe, server.port, "hostile")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"hostile shared={INVALID_VALUE} nulldata={INVALID_VALUE} pop={MISSING_CONFIGURATION}"


def test_no_server_is_no_device(programs: Programs, runtime_probe: Path) -> None:
    """Without a configured server the client has no device: cudaGetDeviceCount says
    cudaErrorNoDevice (what a program on a machine without GPUs is told), not a hang or a crash."""
    env = {**probe_env(programs, "", ""), "GPUPOOL_REMOTE_DIR": "/nonexistent"}
    done = subprocess.run([str(runtime_probe), "properties"], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.stdout.strip() == "properties error 100"


def exported_functions(library: Path) -> dict[str, str]:
    """The functions ``library`` exports, each with its symbol version."""
    table = subprocess.run(["objdump", "-T", str(library)], capture_output=True, text=True, check=True, timeout=60)
    return {fields[-1]: fields[-2] for fields in (line.split() for line in table.stdout.splitlines())
            if len(fields) >= 7 and fields[3] == ".text"}


def test_every_function_of_nvidias_runtime_is_exported_at_its_version(programs: Programs) -> None:
    """A program linked against NVIDIA's libcudart.so.12 finds each function it calls in gpupool's
    (carried or refused), at NVIDIA's symbol version: it starts, and fails only in what it calls."""
    nvidias = exported_functions(cudart_dir() / "lib" / RUNTIME_SONAME)
    ours = exported_functions(programs.client / RUNTIME_SONAME)
    assert set(ours) == set(nvidias)
    assert set(ours.values()) == {RUNTIME_SONAME}


@pytest.mark.slow
def test_the_pods_preload_wins_over_a_copy_the_program_names(programs: Programs, tmp_path: Path) -> None:
    """A program linked to NVIDIA's libcudart.so.12 with an RPATH to it (as a wheel's library is:
    searched before LD_LIBRARY_PATH) gets NVIDIA's runtime with the client directory on
    LD_LIBRARY_PATH, and every call fails; with the webhook's LD_PRELOAD of what install-client put
    in the pod's directory (the client, then gpupool's runtime) it gets gpupool's, and every call
    succeeds."""
    from gpupool.extender.remote_injection import PRELOAD
    from gpupool.remotegpu.install_client import install_client

    runtime = cudart_dir() / "lib"
    probe = tmp_path / "cudart_probe_rpath"
    subprocess.run([*find_compiler(), "-std=gnu11", "-O1", "-o", str(probe), str(CUDART_PROBE), f"-I{HEADER_SHIM}",
                    f"-I{runtime.parent / 'include'}", str(runtime / RUNTIME_SONAME), "-Wl,--disable-new-dtags",
                    f"-Wl,-rpath,{runtime}"], check=True, timeout=120)
    pod, grant = tmp_path / "pod-lib", tmp_path / "grant"
    grant.mkdir()
    for key in ("remote_endpoint", "remote_token"):
        (grant / key).write_text("set by the test's environment")
    install_client('{"v": 1}', programs.client / "libcuda.so.1", pod, grant, wait_s=0)
    preload = PRELOAD.replace("/var/run/gpupool-remote/lib", str(pod))
    with running_server(programs, tmp_path, [client("a", SHARE_MIB)]) as server:
        env = probe_env(programs, f"127.0.0.1:{server.port}", token("a"))
        by_path = subprocess.run([str(probe), "calls"], env=env, capture_output=True, text=True, timeout=60)
        preloaded = subprocess.run([str(probe), "calls"], env={**env, "LD_PRELOAD": preload}, capture_output=True,
                                   text=True, timeout=60)
    assert by_path.stdout.split()[1] == f"getDeviceCount={NOT_SUPPORTED}"  # NVIDIA's, by the RPATH
    assert preloaded.stdout.splitlines() == [
        "calls " + " ".join(f"{name}={CUDA_SUCCESS}" for name in RUNTIME_CALLS), "values 1 1"], preloaded.stderr
    assert preloaded.stderr == ""
