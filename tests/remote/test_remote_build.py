"""The remote GPU's programs as an installation ships them: built once into the package (what the
image does, since a node agent's image has no compiler), then found there before any cached build."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.cli.main import cli
from gpupool.shim import remote_build
from gpupool.shim.remote_build import (
    BLAS_LT_SONAME,
    BLAS_SONAME,
    CLIENT_SONAME,
    PLACEHOLDER_NAME,
    RUNTIME_SONAME,
    build_into,
    client_directory,
    placeholder_library,
    server_program,
)

ROOT = Path(__file__).resolve().parents[2]


def test_packaged_programs_win_over_a_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(remote_build, "PACKAGED_DIR", tmp_path)

    def no_build(**_kwargs: object) -> Path:
        raise AssertionError("built although the installation carries the program")

    (tmp_path / "gpupool-remote-server").write_text("#!/bin/sh\n")
    (tmp_path / "remote-client").mkdir()
    (tmp_path / "remote-client" / CLIENT_SONAME).write_text("elf")
    (tmp_path / "remote-client" / PLACEHOLDER_NAME).write_text("elf")
    monkeypatch.setattr(remote_build, "build_server", no_build)
    monkeypatch.setattr(remote_build, "build_client", no_build)
    monkeypatch.setattr(remote_build, "build_placeholder", no_build)
    assert server_program() == tmp_path / "gpupool-remote-server"
    assert client_directory() == tmp_path / "remote-client"
    assert placeholder_library() == tmp_path / "remote-client" / PLACEHOLDER_NAME


def test_without_packaged_programs_they_are_built(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(remote_build, "PACKAGED_DIR", tmp_path / "empty")
    monkeypatch.setattr(remote_build, "build_server", lambda **_kw: tmp_path / "built-server")
    monkeypatch.setattr(remote_build, "build_client", lambda **_kw: tmp_path / "built-client")
    monkeypatch.setattr(remote_build, "build_placeholder", lambda **_kw: tmp_path / "built-placeholder")
    assert server_program() == tmp_path / "built-server"
    assert client_directory() == tmp_path / "built-client"
    assert placeholder_library() == tmp_path / "built-placeholder"


@pytest.mark.slow  # compiles the server and the client (cached by digest)
def test_build_into_writes_what_serve_and_client_path_then_use(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["remote-gpu", "build", "--into", str(tmp_path / "lib")])
    assert result.exit_code == 0, result.output
    server, client = tmp_path / "lib" / "gpupool-remote-server", tmp_path / "lib" / "remote-client"
    assert result.output.split() == [str(server), str(client)]
    assert os.access(server, os.X_OK)
    assert (client / "libcuda.so").resolve() == (client / CLIENT_SONAME).resolve()
    soname = subprocess.run(["readelf", "-d", str(client / CLIENT_SONAME)], capture_output=True, text=True)
    assert soname.returncode != 0 or f"[{CLIENT_SONAME}]" in soname.stdout
    runtime = subprocess.run(["readelf", "-d", str(client / RUNTIME_SONAME)], capture_output=True, text=True)
    assert runtime.returncode != 0 or f"[{RUNTIME_SONAME}]" in runtime.stdout  # gpupool's CUDA runtime beside it
    assert (client / "libcudart.so").resolve() == (client / RUNTIME_SONAME).resolve()  # what -lcudart finds
    blas = subprocess.run(["readelf", "-d", str(client / BLAS_SONAME)], capture_output=True, text=True)
    assert blas.returncode != 0 or f"[{BLAS_SONAME}]" in blas.stdout  # gpupool's cuBLAS beside it
    assert (client / "libcublas.so").resolve() == (client / BLAS_SONAME).resolve()  # what -lcublas finds
    blas_lt = subprocess.run(["readelf", "-d", str(client / BLAS_LT_SONAME)], capture_output=True, text=True)
    assert blas_lt.returncode != 0 or (f"[{BLAS_LT_SONAME}]" in blas_lt.stdout  # gpupool's cuBLASLt beside it,
                                       and f"[{BLAS_SONAME}]" in blas_lt.stdout)  # linked to gpupool's cuBLAS
    assert (client / "libcublasLt.so").resolve() == (client / BLAS_LT_SONAME).resolve()  # what -lcublasLt finds
    monkeypatch.setattr(remote_build, "PACKAGED_DIR", tmp_path / "lib")
    assert server_program() == server and client_directory() == client
    assert placeholder_library() == client / PLACEHOLDER_NAME  # what a local share's init container copies
    again = build_into(tmp_path / "lib")  # a second build over an installed one replaces it in place
    assert again == (server, client)


def test_the_image_ships_the_remote_programs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "libssl-dev" in dockerfile
    assert "gpupool remote-gpu build" in dockerfile
    assert "--into /install/lib/python3.11/site-packages/gpupool/shim/lib" in dockerfile


def test_the_installed_package_carries_the_remote_sources() -> None:
    """The image builds the remote programs from the installed package (``pip install .``, then
    ``gpupool remote-gpu build``): every source of shim/src/remote must be package data."""
    import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["gpupool"]
    packaged = {path for pattern in patterns for path in (ROOT / "gpupool").glob(pattern)}  # "*" stays in its folder
    sources = {p for p in remote_build.REMOTE_DIR.iterdir() if p.suffix in (".c", ".h", ".map")}
    assert remote_build.REMOTE_DIR / "local_share.c" in sources
    assert {remote_build.REMOTE_DIR / name for name in remote_build.RUNTIME_FILES} <= sources
    assert sorted(p.name for p in sources - packaged) == []


def test_the_server_problem_is_what_server_program_would_meet(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    from gpupool.shim.build import ShimBuildError

    monkeypatch.setattr(remote_build, "PACKAGED_DIR", tmp_path)

    def no_compiler() -> str:
        raise ShimBuildError("no cc")

    monkeypatch.setattr(remote_build, "find_compiler", no_compiler)
    assert remote_build.server_problem() == f"no prebuilt GPU server at {tmp_path / 'gpupool-remote-server'} " \
                                           "and no C compiler to build one"
    (tmp_path / "gpupool-remote-server").write_text("#!/bin/sh\n")
    assert remote_build.server_problem() == ""  # packaged: no compiler needed
    (tmp_path / "gpupool-remote-server").unlink()
    monkeypatch.setattr(remote_build, "find_compiler", lambda: "cc")
    assert remote_build.server_problem() == ""  # built at the server's first start
