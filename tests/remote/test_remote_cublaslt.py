"""gpupool's cuBLASLt (gpupool/shim/src/remote/cublaslt.c, a libcublasLt.so.12 beside gpupool's
cuBLAS; docs/remote-gpu.md, "cuBLAS"): PyTorch hands cuBLASLt its cuBLAS handle, which with
gpupool's cuBLAS is the GPU server's value, and NVIDIA's cuBLASLt dereferenced it (a segfault in
cublasLtMatmulAlgoGetHeuristic for F.linear with a bias). gpupool's copy answers every call of the
matmul path CUBLAS_STATUS_NOT_SUPPORTED with one stderr line per function, reads none of the
pointers it is given, answers the handle, version and name calls itself, and exports every
function of CUDA 12.6's cublasLt.h."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpupool.shim.remote_build import BLAS_LT_SONAME, BLAS_SONAME
from tests.remote.remote_support import Programs, build_client_program, build_programs
from tests.remote.test_remote_cublas import blas_server, build_standin_cublas, defined_functions, run

PROBE_SOURCE = Path(__file__).with_name("cublaslt_probe.c")
SUCCESS, NOT_INITIALIZED, INVALID_VALUE, NOT_SUPPORTED = 0, 1, 7, 15

CUBLASLT_H_FUNCTIONS = frozenset({
    "cublasLtCreate", "cublasLtDestroy", "cublasLtGetStatusName", "cublasLtGetStatusString", "cublasLtGetVersion",
    "cublasLtGetCudartVersion", "cublasLtGetProperty", "cublasLtHeuristicsCacheGetCapacity",
    "cublasLtHeuristicsCacheSetCapacity", "cublasLtDisableCpuInstructionsSetMask", "cublasLtMatmul",
    "cublasLtMatrixTransform", "cublasLtMatrixLayoutInit_internal", "cublasLtMatrixLayoutCreate",
    "cublasLtMatrixLayoutDestroy", "cublasLtMatrixLayoutSetAttribute", "cublasLtMatrixLayoutGetAttribute",
    "cublasLtMatmulDescInit_internal", "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy",
    "cublasLtMatmulDescSetAttribute", "cublasLtMatmulDescGetAttribute", "cublasLtMatrixTransformDescInit_internal",
    "cublasLtMatrixTransformDescCreate", "cublasLtMatrixTransformDescDestroy",
    "cublasLtMatrixTransformDescSetAttribute", "cublasLtMatrixTransformDescGetAttribute",
    "cublasLtMatmulPreferenceInit_internal", "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy",
    "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulPreferenceGetAttribute", "cublasLtMatmulAlgoGetHeuristic",
    "cublasLtMatmulAlgoGetIds", "cublasLtMatmulAlgoInit", "cublasLtMatmulAlgoCheck",
    "cublasLtMatmulAlgoCapGetAttribute", "cublasLtMatmulAlgoConfigSetAttribute",
    "cublasLtMatmulAlgoConfigGetAttribute", "cublasLtLoggerSetCallback", "cublasLtLoggerSetFile",
    "cublasLtLoggerOpenFile", "cublasLtLoggerSetLevel", "cublasLtLoggerSetMask", "cublasLtLoggerForceDisable",
})
"""Every function CUDA 12.6's cublasLt.h declares (the static inline *Init helpers excepted: they
call the *_internal functions), as cublas_refused.h took cuBLAS's names from 12.6's headers."""


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return build_programs(tmp_path_factory.mktemp("remote-programs"))


@pytest.fixture(scope="module")
def standin_cublas(programs: Programs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standin_cublas(programs, tmp_path_factory.mktemp("standin-cublas"))


@pytest.fixture(scope="module")
def probe(programs: Programs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/remote/cublaslt_probe.c linked to gpupool's libcublasLt.so.12 and libcublas.so.12."""
    out = tmp_path_factory.mktemp("cublaslt-probe") / "cublaslt_probe"
    assert (programs.client / BLAS_LT_SONAME).is_file(), "gpupool's cuBLASLt was not built beside the client"
    return build_client_program(PROBE_SOURCE, out, programs,
                                ("-lcublasLt", "-lcublas", "-lcudart", f"-Wl,-rpath,{programs.client}"))


def refusal(name: str) -> str:
    return f"gpupool cuBLASLt: {name} is not carried to the GPU: CUBLAS_STATUS_NOT_SUPPORTED"


@pytest.mark.slow
def test_pytorchs_addmm_calls_are_refused_without_a_crash(programs: Programs, probe: Path, standin_cublas: Path,
                                                          tmp_path: Path) -> None:
    """What at::cuda::blas::gemm_and_bias calls, with gpupool's cuBLAS handle as the cuBLASLt handle:
    each creation NOT_SUPPORTED with NULL in its output, attributes, the heuristic query (twice:
    one line) and cublasLtMatmul NOT_SUPPORTED, the heuristic's results untouched and 0 counted,
    unmapped descriptor and matrix pointers never read, the deleters' NULLs accepted and a
    descriptor this library never made refused; the cuBLAS handle is still destroyed cleanly. One
    stderr line per refused function."""
    with blas_server(programs, tmp_path, standin_cublas) as (server, _log):
        done = run(programs, probe, server.port, "addmm")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == [
        f"create={SUCCESS}", f"desc_create={NOT_SUPPORTED}:null", f"desc_set={NOT_SUPPORTED}",
        f"desc_set_bias={NOT_SUPPORTED}", "layouts=151515:null", f"pref_create={NOT_SUPPORTED}:null",
        f"pref_set={NOT_SUPPORTED}", f"heuristic={NOT_SUPPORTED}:0:kept", f"heuristic_again={NOT_SUPPORTED}",
        f"matmul={NOT_SUPPORTED}", "destroys=0000", f"destroy_foreign={INVALID_VALUE}", f"blas_destroy={SUCCESS}"]
    assert done.stderr.splitlines() == [refusal(name) for name in (
        "cublasLtMatmulDescCreate", "cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutCreate",
        "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulAlgoGetHeuristic",
        "cublasLtMatmul")]


@pytest.mark.slow
def test_handles_version_and_names_are_answered_here(programs: Programs, probe: Path, standin_cublas: Path,
                                                     tmp_path: Path) -> None:
    """cublasLtCreate gives distinct handles of this library's own, destroyed once; a cuBLAS handle
    (PyTorch's cast) or NULL is not one; the version and properties are the server's cuBLAS's
    (as gpupool's cuBLAS reports them), the runtime version gpupool's runtime's, the names
    cuBLAS's. Nothing on stderr."""
    with blas_server(programs, tmp_path, standin_cublas) as (server, _log):
        done = run(programs, probe, server.port, "handles")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == [
        f"create={SUCCESS}", "lt_create=0", "distinct=1", f"lt_null={INVALID_VALUE}", "lt_destroy=0",
        f"lt_destroy_again={INVALID_VALUE}", f"lt_destroy_blas={INVALID_VALUE}", f"lt_destroy_null={NOT_INITIALIZED}",
        "version_same=1", f"property={SUCCESS}:1", "cudart=12090", "name=CUBLAS_STATUS_NOT_SUPPORTED", "string=ok",
        f"blas_destroy={SUCCESS}"]
    assert done.stderr == ""


def test_the_library_exports_every_function_of_cublaslt_h_at_its_soname(programs: Programs) -> None:
    """Exactly the 45 names, each at the version libcublasLt.so.12 (cublaslt.map), and it needs
    gpupool's libcublas.so.12 (found beside it through RUNPATH $ORIGIN)."""
    library = programs.client / BLAS_LT_SONAME
    assert len(CUBLASLT_H_FUNCTIONS) == 45
    assert defined_functions(library) == CUBLASLT_H_FUNCTIONS
    table = subprocess.run(["objdump", "-T", str(library)], capture_output=True, text=True, check=True, timeout=60)
    versions = {line.split()[-2] for line in table.stdout.splitlines() if " .text" in line}
    assert versions == {BLAS_LT_SONAME}
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True, timeout=60)
    assert f"[{BLAS_SONAME}]" in dynamic.stdout and f"[{BLAS_LT_SONAME}]" in dynamic.stdout
    assert "[$ORIGIN]" in dynamic.stdout
