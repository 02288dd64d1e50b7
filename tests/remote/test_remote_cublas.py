"""gpupool's cuBLAS (gpupool/shim/src/remote/cublas.c, a libcublas.so.12 that forwards the cuBLAS
API to the GPU server, which runs the node's own libcublas; docs/remote-gpu.md, "cuBLAS"): a
program on gpupool's runtime and cuBLAS, through a server on the stand-in driver with the stand-in
cuBLAS (gpupool/shim/src/standin/cublas.c, a CPU GEMM over the stand-in's device memory), gets
every carried call's result right against its own CPU reference; a refused function is
CUBLAS_STATUS_NOT_SUPPORTED with one stderr line; another client's handle and memory outside the
client's allocations are refused without harm to the server or other clients; a server without a
loadable cuBLAS answers CUBLAS_STATUS_NOT_INITIALIZED; a killed client's handles are destroyed."""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpupool.remotegpu.cublas_lookup import BLAS_LT_SONAME
from gpupool.remotegpu.serve import mirror_text
from gpupool.shim.build import STANDIN_DIR, find_compiler
from gpupool.shim.remote_build import BLAS_SONAME, REMOTE_DIR, build_server
from tests.remote.remote_support import (
    REPO,
    Programs,
    Server,
    build_client_program,
    build_programs,
    client,
    probe_env,
    running_server,
    token,
)
from tests.remote.test_wire_protocol import frame, hello, receive

PROBE_SOURCE = Path(__file__).with_name("cublas_probe.c")
SUCCESS, NOT_INITIALIZED, INVALID_VALUE, NOT_SUPPORTED = 0, 1, 7, 15
BLAS_CASES = ("version", "math_mode", "workspace", "status_name", "sgemm_nn", "sgemm_tt", "dgemm_nt", "dgemm_tn",
              "gemmex", "sgemm_strided", "dgemm_strided", "gemmex_strided", "stream", "sgemm_on_stream", "sgemv_n",
              "sgemv_t", "dgemv", "saxpy", "sscal", "sdot_host", "sdot_device", "sgemv_device_scalars",
              "setget_matrix", "setget_vector", "destroy")


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return build_programs(tmp_path_factory.mktemp("remote-programs"))


def build_standin_cublas(programs: Programs, out: Path) -> Path:
    """The stand-in cuBLAS as ``libcublas.so.12``, linked to the stand-in driver."""
    library = out / BLAS_SONAME
    subprocess.run([*find_compiler(), "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror", "-O1",
                    "-fPIC", "-shared", "-fvisibility=hidden", f"-Wl,-soname,{BLAS_SONAME}", "-o", str(library),
                    str(STANDIN_DIR / "cublas.c"), f"-L{programs.standin}", "-lcuda"], check=True, timeout=120)
    return library


@pytest.fixture(scope="module")
def standin_cublas(programs: Programs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standin_cublas(programs, tmp_path_factory.mktemp("standin-cublas"))


@pytest.fixture(scope="module")
def probe(programs: Programs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/remote/cublas_probe.c linked to gpupool's libcublas.so.12 and libcudart.so.12."""
    out = tmp_path_factory.mktemp("cublas-probe") / "cublas_probe"
    assert (programs.client / BLAS_SONAME).is_file(), "gpupool's cuBLAS was not built beside the client"
    return build_client_program(PROBE_SOURCE, out, programs,
                                ("-lcublas", "-lcudart", "-lm", f"-Wl,-rpath,{programs.client}"))


@contextmanager
def blas_server(programs: Programs, workdir: Path, library: Path | None, letters: str = "a",
                extra: Sequence[str] = ()) -> Iterator[tuple[Server, Path]]:
    """A server whose cuBLAS is ``library`` (None: a path that loads nothing); yields it and the
    stand-in cuBLAS's log of handles."""
    log = workdir / "cublas.log"
    env = {"GPUPOOL_REMOTE_CUBLAS": str(library or workdir / "missing" / BLAS_SONAME),
           "GPUPOOL_STANDIN_CUBLAS_LOG": str(log)}
    with running_server(programs, workdir, [client(letter) for letter in letters], card=env, extra=extra) as server:
        yield server, log


def run(programs: Programs, probe: Path, port: int, *args: str, letter: str = "a",
        answered: bool = False) -> subprocess.CompletedProcess[str]:
    """The probe as client ``letter``; ``answered``: with GPUPOOL_REMOTE_BLAS_SYNC=1 (every call answered)."""
    env = probe_env(programs, f"127.0.0.1:{port}", token(letter))
    if answered:
        env["GPUPOOL_REMOTE_BLAS_SYNC"] = "1"
    return subprocess.run([str(probe), *args], env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
@pytest.mark.parametrize(("extra", "answered"), [([], False), (["--enforce-compute"], False), ([], True)],
                         ids=["direct", "executor", "answered"])
def test_every_carried_call_gives_the_cpu_references_result(programs: Programs, probe: Path, standin_cublas: Path,
                                                            tmp_path: Path, extra: list[str], answered: bool) -> None:
    """SGEMM and DGEMM with both transposes and leading dimensions above m, GemmEx, the three strided
    batched forms, SGEMV (both transposes, increments of 2), DGEMV, SAXPY, SSCAL, SDOT into host and
    device memory, GEMV with alpha and beta in device memory, a SGEMM on a stream set on the handle
    (GetStream gives it back, and the server's cuBLAS got it), Set/GetMatrix with leading dimensions
    and Set/GetVector with increments, the version, math mode and a workspace of the program's own
    memory: each status 0 and each result the probe's CPU reference's; nothing on stderr. The same
    under --enforce-compute, where the executor (the interception library loaded) runs cuBLAS, and
    with GPUPOOL_REMOTE_BLAS_SYNC=1 (every call answered instead of the GEMMs, GEMV, AXPY, SCAL and
    the device SDOT sent without a reply)."""
    with blas_server(programs, tmp_path, standin_cublas, extra=extra) as (server, log):
        done = run(programs, probe, server.port, "blas", answered=answered)
    assert done.returncode == 0, done.stdout + done.stderr
    words = done.stdout.split()
    assert words[:2] == ["blas", f"create={SUCCESS}"], done.stdout
    assert words[2:] == [f"{name}={SUCCESS}:ok" for name in BLAS_CASES], done.stdout
    assert done.stderr == ""
    lines = log.read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["create", "stream", "destroy"], lines
    assert lines[1].split()[3] != "(nil)"  # the program's stream, not the default one


@pytest.mark.slow
def test_serve_finds_the_wheels_cublas_in_its_python_and_says_so(programs: Programs, probe: Path,
                                                                  standin_cublas: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """No --cublas and no GPUPOOL_REMOTE_CUBLAS: `gpupool remote-gpu serve` finds the nvidia-cublas-cu12
    wheel's nvidia/cublas/lib/libcublas.so.12 in the Python it runs in (here the stand-in cuBLAS laid
    out as the wheel in a site directory on PYTHONPATH), logs it at start and hands it to the C server,
    whose cuBLAS then answers the program's calls."""
    monkeypatch.delenv("GPUPOOL_REMOTE_CUBLAS", raising=False)
    site = tmp_path / "site"
    wheel_lib = site / "nvidia" / "cublas" / "lib"
    wheel_lib.mkdir(parents=True)
    (site / "nvidia" / "cublas" / "__init__.py").write_text("")
    shutil.copy(standin_cublas, wheel_lib / BLAS_SONAME)
    shutil.copy(standin_cublas, wheel_lib / BLAS_LT_SONAME)  # beside it, as in the wheel (unused here)
    log = tmp_path / "cublas.log"
    card = {"PYTHONPATH": f"{REPO}:{site}", "GPUPOOL_STANDIN_CUBLAS_LOG": str(log)}
    with running_server(programs, tmp_path, [client("a")], card=card) as server:
        done = run(programs, probe, server.port, "blas")
    said = [line for line in server.log if "cuBLAS" in line]
    assert len(said) == 1 and said[0].rstrip().endswith(
        f"remote GPU: cuBLAS calls run on {wheel_lib / BLAS_SONAME} (the nvidia-cublas-cu12 wheel)"), server.log
    assert done.returncode == 0 and done.stdout.split()[:2] == ["blas", f"create={SUCCESS}"], done.stdout + done.stderr
    assert done.stdout.split()[2:] == [f"{name}={SUCCESS}:ok" for name in BLAS_CASES], done.stdout
    assert [line.split()[1] for line in log.read_text().splitlines()] == ["create", "stream", "destroy"]


def test_a_host_directorys_cublas_finds_cublaslt_beside_it_without_a_runpath(programs: Programs, probe: Path,
                                                                              tmp_path: Path) -> None:
    """A CUDA toolkit's lib64 mounted from the host: its libcublas.so.12 needs libcublasLt.so.12 and
    may carry no RUNPATH. The server runs with the chosen file's directory first on its library path,
    so the cuBLASLt beside it is found; before, the dlopen failed and every create answered 1."""
    toolkit = tmp_path / "lib64"
    toolkit.mkdir()
    lt_source = tmp_path / "lt.c"
    lt_source.write_text("int gpupool_test_cublaslt_marker(void) { return 1; }\n")
    subprocess.run([*find_compiler(), "-fPIC", "-shared", f"-Wl,-soname,{BLAS_LT_SONAME}", "-o",
                    str(toolkit / BLAS_LT_SONAME), str(lt_source)], check=True, timeout=120)
    library = toolkit / BLAS_SONAME
    subprocess.run([*find_compiler(), "-std=gnu11", "-O1", "-fPIC", "-shared", "-fvisibility=hidden",
                    f"-Wl,-soname,{BLAS_SONAME}", "-Wl,--no-as-needed", "-o", str(library),
                    str(STANDIN_DIR / "cublas.c"), f"-L{toolkit}", f"-l:{BLAS_LT_SONAME}", f"-L{programs.standin}",
                    "-lcuda"], check=True, timeout=120)
    needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    assert f"[{BLAS_LT_SONAME}]" in needed and "RUNPATH" not in needed and "RPATH" not in needed
    with blas_server(programs, tmp_path, library) as (server, _):
        done = run(programs, probe, server.port, "blas")
    assert done.returncode == 0 and done.stdout.split()[:2] == ["blas", f"create={SUCCESS}"], done.stdout + done.stderr


@pytest.mark.slow
def test_a_refused_function_says_so_once(programs: Programs, probe: Path, standin_cublas: Path,
                                         tmp_path: Path) -> None:
    """cublasSrot_v2 is not carried: CUBLAS_STATUS_NOT_SUPPORTED twice, one stderr line naming it."""
    with blas_server(programs, tmp_path, standin_cublas) as (server, _):
        done = run(programs, probe, server.port, "refused")
    assert done.stdout.strip() == f"refused {NOT_SUPPORTED} {NOT_SUPPORTED}"
    assert done.stderr.splitlines() == [
        "gpupool cuBLAS: cublasSrot_v2 is not carried to the GPU: CUBLAS_STATUS_NOT_SUPPORTED"]


@pytest.mark.slow
def test_another_clients_handle_and_memory_outside_the_allocations_are_refused(
        programs: Programs, probe: Path, standin_cublas: Path, tmp_path: Path) -> None:
    """Client b naming client a's live handle gets CUBLAS_STATUS_NOT_INITIALIZED (the server knows
    only handles it made for b; here gpupool's cuBLAS refuses it before sending) and its own SGEMM
    still works; with every call answered (GPUPOOL_REMOTE_BLAS_SYNC=1) a C past its allocation's
    end, a C a MiB past it, an A at an address b never allocated and a device alpha outside its
    memory are CUBLAS_STATUS_INVALID_VALUE, never handed to cuBLAS; a's process and the server go on."""
    with blas_server(programs, tmp_path, standin_cublas, letters="ab") as (server, _):
        env = probe_env(programs, f"127.0.0.1:{server.port}", token("a"))
        holder = subprocess.Popen([str(probe), "hold"], env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None
            line = holder.stdout.readline().split()
            assert line[0] == "handle", line
            forged = run(programs, probe, server.port, "forged", line[1], letter="b")
            outside = run(programs, probe, server.port, "outside", letter="b", answered=True)
            assert holder.poll() is None
            again = run(programs, probe, server.port, "blas", letter="b")
        finally:
            holder.kill()
            holder.wait(timeout=10)
    assert forged.stdout.splitlines() == [f"forged {NOT_INITIALIZED}", f"own {SUCCESS}:ok"], forged.stderr
    assert outside.stdout.splitlines() == [f"outside {INVALID_VALUE} {INVALID_VALUE} {INVALID_VALUE} {SUCCESS} "
                                           f"{INVALID_VALUE}", f"after {SUCCESS}:ok"], outside.stderr
    assert again.stdout.split()[2:] == [f"{name}={SUCCESS}:ok" for name in BLAS_CASES]


ILLEGAL_ADDRESS, EXECUTION_FAILED = 700, 13


@pytest.mark.slow
def test_memory_outside_the_allocations_is_an_asynchronous_error(programs: Programs, probe: Path,
                                                                  standin_cublas: Path, tmp_path: Path) -> None:
    """Sent without a reply, a SGEMM whose C lies a MiB past b's memory returns 0 and the next
    cudaDeviceSynchronize returns cudaErrorIllegalAddress (700), once; so does cudaStreamSynchronize
    after a C past its allocation's end; after an A at an address b never allocated, the next
    answered cuBLAS call (cublasSetMathMode) gets CUBLAS_STATUS_EXECUTION_FAILED (13). A negative m,
    a transpose of 5, lda 1 for 2 rows, an increment of 0 (INVALID_VALUE) and a handle never made or
    destroyed (NOT_INITIALIZED) are still refused at once, and send nothing (the synchronisation
    after them is clean). A device alpha outside b's memory: the SSCAL returns 0, the sync 700.
    b's own SGEMM is then right; a, holding its handle meanwhile, and then a full run of every call
    by a are unaffected, and the server goes on."""
    with blas_server(programs, tmp_path, standin_cublas, letters="ab") as (server, _):
        env = probe_env(programs, f"127.0.0.1:{server.port}", token("a"))
        holder = subprocess.Popen([str(probe), "hold"], env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().startswith("handle ")
            late = run(programs, probe, server.port, "late", letter="b")
            assert holder.poll() is None
        finally:
            holder.kill()
            holder.wait(timeout=10)
        again = run(programs, probe, server.port, "blas", letter="a")
    assert late.stdout.splitlines() == [
        "late " + " ".join(str(status) for status in (
            SUCCESS, ILLEGAL_ADDRESS, SUCCESS, SUCCESS, ILLEGAL_ADDRESS, SUCCESS, EXECUTION_FAILED, INVALID_VALUE,
            INVALID_VALUE, INVALID_VALUE, INVALID_VALUE, NOT_INITIALIZED, NOT_INITIALIZED, SUCCESS, SUCCESS, SUCCESS,
            ILLEGAL_ADDRESS)),
        f"after {SUCCESS}:ok"], late.stdout + late.stderr
    assert late.stderr == ""
    assert again.stdout.split()[2:] == [f"{name}={SUCCESS}:ok" for name in BLAS_CASES]


@pytest.mark.slow
def test_a_server_without_cublas_says_not_initialized(programs: Programs, probe: Path, tmp_path: Path) -> None:
    """The server cannot load its cuBLAS: cublasCreate is CUBLAS_STATUS_NOT_INITIALIZED with one
    stderr line saying why (after the program's copies, which the driver calls carried), and so it
    is for the next client too."""
    with blas_server(programs, tmp_path, None) as (server, _):
        done = run(programs, probe, server.port, "create")
        again = run(programs, probe, server.port, "create")
    assert done.stdout.strip() == f"create {NOT_INITIALIZED}"
    assert done.stderr.splitlines() == [
        "gpupool cuBLAS: the GPU server cannot load cuBLAS (libcublas.so.12): CUBLAS_STATUS_NOT_INITIALIZED"]
    assert again.stdout.strip() == f"create {NOT_INITIALIZED}"


@pytest.mark.slow
def test_a_killed_clients_handles_are_destroyed(programs: Programs, probe: Path, standin_cublas: Path,
                                                tmp_path: Path) -> None:
    """A client killed while it holds a handle: its server process destroys the handle as it ends."""
    with blas_server(programs, tmp_path, standin_cublas) as (server, log):
        env = probe_env(programs, f"127.0.0.1:{server.port}", token("a"))
        holder = subprocess.Popen([str(probe), "hold"], env=env, stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None
        assert holder.stdout.readline().startswith("handle ")
        holder.kill()
        holder.wait(timeout=10)
        deadline = time.monotonic() + 20
        while "destroy" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
    lines = log.read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["create", "destroy"], lines
    assert lines[0].split()[2] == lines[1].split()[2]


def defined_functions(library: Path) -> set[str]:
    table = subprocess.run(["objdump", "-T", str(library)], capture_output=True, text=True, check=True, timeout=60)
    return {fields[-1] for fields in (line.split() for line in table.stdout.splitlines())
            if len(fields) >= 7 and fields[3] == ".text"}


def test_the_library_exports_the_carried_and_the_refused_functions(programs: Programs) -> None:
    """Every name of cublas_refused.h and every carried function is exported at libcublas.so.12's
    version; none is both carried and refused."""
    refused = set(re.findall(r"^REFUSED\((\w+)\)$", (REMOTE_DIR / "cublas_refused.h").read_text(), re.MULTILINE))
    carried = set(re.findall(r"^API [^(]*?\b(cublas\w+)\(", (REMOTE_DIR / "cublas.c").read_text(), re.MULTILINE))
    assert len(carried) == 28 and not carried & refused
    assert defined_functions(programs.client / BLAS_SONAME) == carried | refused


OP_MEM_ALLOC, OP_PING = 8, 2
OP_CUBLAS_CREATE, OP_CUBLAS_DESTROY, OP_CUBLAS_GEMM, OP_CUBLAS_VECTOR = 45, 46, 51, 52
GEMM = struct.Struct("<Q16i3q5Q16s16s")  # struct remote_gemm (protocol.h)
VECTOR = struct.Struct("<Q8i6Q16s16s")  # struct remote_vector


@pytest.fixture
def wire(programs: Programs, standin_cublas: Path, tmp_path: Path) -> Iterator[socket.socket]:
    """A connection to the C server (stand-in driver and cuBLAS) after its hello; the server must
    outlive what the test sends."""
    (tmp_path / "clients.tab").write_text(mirror_text([client("a", memory_mib=64)]))
    env = {**os.environ, "GPUPOOL_STANDIN_STATE": str(tmp_path / "standin.state"),
           "GPUPOOL_REMOTE_CUBLAS": str(standin_cublas)}
    server = subprocess.Popen([str(build_server(werror=True)), "--listen", "127.0.0.1:0", "--clients",
                               str(tmp_path / "clients.tab"), "--driver", str(programs.standin / "libcuda.so.1")],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert server.stdout is not None
        connection, status = hello(int(server.stdout.readline().split()[-1]), token("a"))
        assert status == 0
        yield connection
        connection.close()
        assert server.poll() is None, "the server itself must survive every client"
    finally:
        server.kill()
        server.wait()


def ask(connection: socket.socket, op: int, call: int, payload: bytes) -> tuple[int, bytes]:
    connection.sendall(frame(op, call, payload))
    _, answered, status, body = receive(connection)
    assert answered == call
    return status, body


def gemm(handle: int, pointer: int, **fields: int) -> bytes:
    """A SGEMM request (kind 0) of 2x2 matrices at pointer, fields overriding any int field."""
    names = ("kind", "transa", "transb", "m", "n", "k", "a_type", "b_type", "c_type", "compute_type", "algo", "lda",
             "ldb", "ldc", "batch", "unused")
    ints = {**dict.fromkeys(names, 0), "m": 2, "n": 2, "k": 2, "compute_type": 68, "algo": -1, "lda": 2, "ldb": 2,
            "ldc": 2, "batch": 1, **fields}
    strides = [fields.get(f"stride_{x}", 0) for x in "abc"]
    return GEMM.pack(handle, *(ints[n] for n in names), *strides, pointer, pointer, pointer, 0, 0,
                     struct.pack("<f", 1.0), struct.pack("<f", 0.0))


@pytest.mark.slow
def test_hostile_cublas_frames_cost_nothing(wire: socket.socket) -> None:
    """Short payloads, unknown kinds and transposes, shapes whose reach overflows 64 bits, a
    destroyed handle, and 300 random cuBLAS frames: each answered with a cuBLAS status (or refused),
    the connection still served, the server alive."""
    status, body = ask(wire, OP_MEM_ALLOC, 1, struct.pack("<Q", 1 << 20))
    assert status == 0
    pointer = struct.unpack("<Q", body)[0]
    status, body = ask(wire, OP_CUBLAS_CREATE, 2, b"")
    assert status == SUCCESS
    handle = struct.unpack("<Q", body)[0]
    for op in range(46, 53):
        assert ask(wire, op, 3, b"\x01")[0] == INVALID_VALUE, op  # too short
    assert ask(wire, OP_CUBLAS_GEMM, 4, gemm(handle, pointer))[0] == SUCCESS
    big = 2**31 - 1
    for case in ({"kind": 99}, {"transa": 5}, {"m": -1}, {"lda": 1}, {"a_type": 1234},
                 {"m": big, "n": big, "k": big, "lda": big, "ldb": big, "ldc": big},
                 {"kind": 3, "batch": big, "stride_a": 2**62, "stride_b": 2**62, "stride_c": 2**62},
                 {"kind": 3, "batch": 2, "stride_c": -4}, {"compute_type": 0}):
        assert ask(wire, OP_CUBLAS_GEMM, 5, gemm(handle, pointer, **case))[0] == INVALID_VALUE, case
    vector = VECTOR.pack(handle, 2, 0, 0, big, 0, big, 1, 0, pointer, pointer, pointer, 0, 0, 0, b"", b"")
    assert ask(wire, OP_CUBLAS_VECTOR, 6, vector)[0] == INVALID_VALUE  # a SAXPY reaching 8 GiB
    assert ask(wire, OP_CUBLAS_DESTROY, 7, struct.pack("<Q", handle))[0] == SUCCESS
    assert ask(wire, OP_CUBLAS_DESTROY, 8, struct.pack("<Q", handle))[0] == NOT_INITIALIZED
    assert ask(wire, OP_CUBLAS_GEMM, 9, gemm(handle, pointer))[0] == NOT_INITIALIZED
    rng = random.Random(25)
    for call in range(10, 310):
        op = rng.randrange(45, 53)
        payload = bytes(rng.randrange(256) for _ in range(rng.choice((0, 4, 8, 16, 24, 120, 168, 200))))
        if op == OP_CUBLAS_GEMM and len(payload) >= GEMM.size and rng.random() < 0.5:  # mostly valid, pointers random
            payload = gemm(handle, rng.choice((pointer, pointer + (1 << 20), rng.randrange(2**64))))
        status, _ = ask(wire, op, call, payload)
        assert status in (SUCCESS, NOT_INITIALIZED, INVALID_VALUE, NOT_SUPPORTED), (op, status)
    assert ask(wire, OP_PING, 400, b"")[0] == 0


OP_CTX_SYNCHRONIZE, NO_REPLY = 7, 1


@pytest.mark.slow
def test_hostile_cublas_frames_without_a_reply_leave_a_cuda_error(wire: socket.socket) -> None:
    """cuBLAS frames sent without a reply get none; what they leave comes with the next answered
    call: a GEMM outside the client's memory CUDA_ERROR_ILLEGAL_ADDRESS (700), on a handle not the
    client's CUDA_ERROR_INVALID_HANDLE (400), of a refused shape or short CUDA_ERROR_INVALID_VALUE
    (1), a host-result dot CUDA_ERROR_INVALID_VALUE (it needs its reply); the first error is kept,
    an answered cuBLAS call gets CUBLAS_STATUS_EXECUTION_FAILED (13) without being run; 300 random
    unanswered frames then leave one of those errors and the connection and the server serve on."""
    status, body = ask(wire, OP_MEM_ALLOC, 1, struct.pack("<Q", 1 << 20))
    assert status == 0
    pointer = struct.unpack("<Q", body)[0]
    status, body = ask(wire, OP_CUBLAS_CREATE, 2, b"")
    handle = struct.unpack("<Q", body)[0]

    def late(op: int, payload: bytes) -> None:
        wire.sendall(frame(op, 99, payload, NO_REPLY))

    late(OP_CUBLAS_GEMM, gemm(handle, pointer))
    assert ask(wire, OP_PING, 3, b"")[0] == 0
    late(OP_CUBLAS_GEMM, gemm(handle, pointer + (1 << 20)))
    late(OP_CUBLAS_GEMM, gemm(handle + 8, pointer))  # the first error is the one kept
    assert ask(wire, OP_CTX_SYNCHRONIZE, 4, b"")[0] == ILLEGAL_ADDRESS
    assert ask(wire, OP_PING, 5, b"")[0] == 0
    late(OP_CUBLAS_GEMM, gemm(handle + 8, pointer))
    assert ask(wire, OP_PING, 6, b"")[0] == 400
    for payload in (gemm(handle, pointer, m=-1), gemm(handle, pointer, transa=5), b"\x01"):
        late(OP_CUBLAS_GEMM, payload)
        assert ask(wire, OP_PING, 7, b"")[0] == 1, payload[:16]
    late(OP_CUBLAS_VECTOR, VECTOR.pack(handle, 4, 0, 0, 2, 0, 1, 1, 0, 0, pointer, pointer, 0, 0, 0, b"", b""))
    assert ask(wire, OP_PING, 8, b"")[0] == 1
    late(OP_CUBLAS_GEMM, gemm(handle, 0x1000))
    assert ask(wire, OP_CUBLAS_DESTROY, 9, struct.pack("<Q", handle))[0] == EXECUTION_FAILED
    assert ask(wire, OP_CUBLAS_GEMM, 10, gemm(handle, pointer))[0] == SUCCESS  # the handle was not destroyed
    rng = random.Random(2525)
    for _ in range(300):
        op = rng.choice((OP_CUBLAS_GEMM, OP_CUBLAS_VECTOR))
        payload = bytes(rng.randrange(256) for _ in range(rng.choice((0, 8, 120, 168, 200))))
        if op == OP_CUBLAS_GEMM and rng.random() < 0.5:
            payload = gemm(handle, rng.choice((pointer, pointer + (1 << 20), rng.randrange(2**64))))
        late(op, payload)
    assert ask(wire, OP_PING, 11, b"")[0] in (0, 1, 2, 400, 700, 719, 801)
    assert ask(wire, OP_PING, 12, b"")[0] == 0
    assert ask(wire, OP_CUBLAS_GEMM, 13, gemm(handle, pointer))[0] == SUCCESS
