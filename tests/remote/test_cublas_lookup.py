"""Which NVIDIA cuBLAS `gpupool remote-gpu serve` hands the C server (gpupool/remotegpu/cublas_lookup.py):
--cublas, then GPUPOOL_REMOTE_CUBLAS, then the nvidia-cublas-cu12 wheel in this Python, then the
soname on the library path; the line logged at start says which, or that cuBLAS calls will be refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.remotegpu import cublas_lookup
from gpupool.remotegpu.cublas_lookup import (
    BLAS_LT_SONAME,
    CublasChoice,
    find_cublas,
    on_library_path,
    wheel_library,
)
from gpupool.shim.remote_build import BLAS_SONAME


def cublas_dir(directory: Path, *, with_lt: bool = True) -> Path:
    """``directory`` holding a (fake) libcublas.so.12, and libcublasLt.so.12 beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / BLAS_SONAME).write_bytes(b"\x7fELF")
    if with_lt:
        (directory / BLAS_LT_SONAME).write_bytes(b"\x7fELF")
    return directory / BLAS_SONAME


def fake_wheel(site: Path) -> Path:
    """The nvidia-cublas-cu12 wheel's layout under a site directory (``nvidia`` a namespace package,
    as in the wheel: another nvidia-* wheel installed here merges with it)."""
    (site / "nvidia" / "cublas").mkdir(parents=True)
    (site / "nvidia" / "cublas" / "__init__.py").write_text("")
    return cublas_dir(site / "nvidia" / "cublas" / "lib")


def nothing(*_args: object) -> None:
    return None


def test_the_flag_wins_over_everything(tmp_path: Path) -> None:
    choice = find_cublas("/opt/x/libcublas.so.12", {"GPUPOOL_REMOTE_CUBLAS": "/env/libcublas.so.12"},
                         wheel=lambda: tmp_path / "wheel", library_path=lambda _: tmp_path / "soname")
    assert (choice.path, choice.source, choice.server_argument) == ("/opt/x/libcublas.so.12", "--cublas",
                                                                    "/opt/x/libcublas.so.12")


def test_the_environment_wins_over_the_wheel_and_the_library_path(tmp_path: Path) -> None:
    named = cublas_dir(tmp_path / "env")
    choice = find_cublas(None, {"GPUPOOL_REMOTE_CUBLAS": str(named)}, wheel=lambda: tmp_path / "wheel",
                         library_path=lambda _: tmp_path / "soname")
    assert (choice.path, choice.source, choice.server_argument) == (str(named), "GPUPOOL_REMOTE_CUBLAS", str(named))
    assert choice.describe() == f"remote GPU: cuBLAS calls run on {named} (GPUPOOL_REMOTE_CUBLAS)"


def test_the_wheel_is_found_on_this_pythons_path_without_importing_cuda(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    library = fake_wheel(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [n for n in sys.modules if n == "nvidia" or n.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)
    assert wheel_library() == library
    choice = find_cublas(None, {}, library_path=lambda _: tmp_path / "soname")
    assert (choice.path, choice.source, choice.server_argument) == (str(library), "the nvidia-cublas-cu12 wheel",
                                                                    str(library))
    assert not choice.problems()


def test_a_wheel_package_without_the_library_is_not_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "site" / "nvidia" / "cublas").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [n for n in sys.modules if n == "nvidia" or n.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)
    assert wheel_library() is None
    assert wheel_library(lambda _name: None) is None


def test_the_soname_on_the_library_path_is_the_last_resort(tmp_path: Path) -> None:
    directory = cublas_dir(tmp_path / "lib64").parent
    environ = {"LD_LIBRARY_PATH": f"{tmp_path / 'empty'}::{directory}"}
    assert on_library_path(BLAS_SONAME, environ, cache=nothing, default_dirs=()) == directory / BLAS_SONAME
    choice = find_cublas(None, environ, wheel=lambda: None)
    # found where the C server's own dlopen of the soname finds it: nothing to pass
    assert (choice.path, choice.server_argument) == (str(directory / BLAS_SONAME), None)
    assert choice.describe().endswith(f"({BLAS_SONAME} on the library path)")


def test_the_loaders_cache_and_the_default_directories_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cached = tmp_path / "cache" / BLAS_SONAME
    assert on_library_path(BLAS_SONAME, {}, cache=lambda _: cached, default_dirs=()) == cached
    default = cublas_dir(tmp_path / "usr-lib")
    assert on_library_path(BLAS_SONAME, {}, cache=nothing, default_dirs=[str(default.parent)]) == default
    assert on_library_path(BLAS_SONAME, {}, cache=nothing, default_dirs=[str(tmp_path / "none")]) is None

    class Listing:
        stdout = (f"\t{BLAS_LT_SONAME} (libc6,x86-64) => /usr/local/cuda/lib64/{BLAS_LT_SONAME}\n"
                  f"\t{BLAS_SONAME} (libc6,x86-64) => /usr/local/cuda/lib64/{BLAS_SONAME}\n")

    monkeypatch.setattr(subprocess, "run", lambda *_a, **_k: Listing())
    assert cublas_lookup.loader_cache(BLAS_SONAME) == Path(f"/usr/local/cuda/lib64/{BLAS_SONAME}")
    assert cublas_lookup.loader_cache("libnothing.so.1") is None


def test_none_found_says_cublas_calls_will_be_refused() -> None:
    choice = find_cublas(None, {}, wheel=lambda: None, library_path=nothing)
    assert choice == CublasChoice(None, "none")
    assert choice.describe() == (
        "remote GPU: no cuBLAS found (libcublas.so.12: not given with --cublas or GPUPOOL_REMOTE_CUBLAS, no "
        "nvidia-cublas-cu12 wheel in this Python, not on the library path): the clients' cuBLAS calls will be "
        "refused with CUBLAS_STATUS_NOT_INITIALIZED")


def test_what_keeps_a_named_file_from_loading_is_said(tmp_path: Path) -> None:
    missing = tmp_path / "gone" / BLAS_SONAME
    assert CublasChoice(str(missing), "--cublas").describe().endswith(f"; {missing} does not exist")
    alone = cublas_dir(tmp_path / "alone", with_lt=False)
    assert CublasChoice(str(alone), "--cublas").problems() == [
        "no libcublasLt.so.12 beside it: the loader must find one elsewhere on the library path"]
    assert CublasChoice(BLAS_SONAME, "GPUPOOL_REMOTE_CUBLAS").problems() == []  # a soname: the loader's to find


def test_the_servers_library_path_starts_with_the_chosen_cublas_directory(tmp_path: Path) -> None:
    """cuBLASLt beside a chosen cuBLAS is found by the C server's loader whether or not that copy
    carries a RUNPATH: its directory comes first on the server's LD_LIBRARY_PATH."""
    named = str(tmp_path / "cuda" / "libcublas.so.12")
    chosen = CublasChoice(named, "--cublas", named)
    assert chosen.server_environment({"LD_LIBRARY_PATH": "/opt/x", "A": "1"}) == {
        "LD_LIBRARY_PATH": f"{tmp_path / 'cuda'}:/opt/x", "A": "1"}
    assert chosen.server_environment({})["LD_LIBRARY_PATH"] == str(tmp_path / "cuda")
    by_soname = CublasChoice("libcublas.so.12", "the library path")
    assert by_soname.server_environment({"LD_LIBRARY_PATH": "/opt/x"}) == {"LD_LIBRARY_PATH": "/opt/x"}
    assert CublasChoice(None, "none").server_environment({}) == {}
