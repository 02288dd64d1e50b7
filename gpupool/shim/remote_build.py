"""Build the remote GPU's two programs from the shipped C sources (docs/remote-gpu.md).

* the GPU server, ``gpupool-remote-server``: an executable that dlopens the node's driver (needs
  OpenSSL 3's headers and libraries to build: ``libssl-dev``);
* the GPU client, a ``libcuda.so.1`` that forwards the driver API to a server, for containers on
  nodes without GPUs, and beside it gpupool's CUDA runtime, a ``libcudart.so.12`` that implements
  part of the CUDA runtime API on the driver API (NVIDIA's runtime cannot start on the client), and
  gpupool's ``libcublas.so.12``, which forwards cuBLAS calls to the server's own cuBLAS (NVIDIA's
  cannot run on the client either), and gpupool's ``libcublasLt.so.12``, which refuses cuBLASLt's
  matmul calls cleanly (NVIDIA's crashes a client process: it is handed gpupool's cuBLAS handles);
* the local-share placeholder, an empty shared object the GPU client's init container installs in
  the client's place when the pod's share is on its own node (the webhook's ``LD_PRELOAD`` names
  the client's path before the bind decides; a missing file there makes the loader complain at
  every program start).

Cached by digest like the interception library (:mod:`gpupool.shim.build`): a changed source or
compiler never reuses a stale build.
"""

from __future__ import annotations

from pathlib import Path

from gpupool.shim.build import (
    PACKAGED_LIBRARY,
    RELEASE,
    Flavour,
    ShimBuildError,
    _compile,
    _digest,
    cache_dir,
    find_compiler,
)
from gpupool.shim.build import SOURCE_DIR as SHIM_SOURCE_DIR

PACKAGED_DIR = PACKAGED_LIBRARY.parent
"""Where an installation keeps the prebuilt programs (the image writes them there, beside the
interception library): a node agent's image has no compiler."""
SERVER_NAME = "gpupool-remote-server"
CLIENT_DIR_NAME = "remote-client"

REMOTE_DIR = SHIM_SOURCE_DIR / "remote"
SERVER_SOURCES = ("server.c",)
CLIENT_SOURCES = ("client.c",)
RUNTIME_SOURCES = ("cudart.c",)
RUNTIME_FILES = ("cudart_refused.h", "cudart.map")
"""Included by cudart.c (the functions it refuses) and its version script (NVIDIA's symbol version)."""
RUNTIME_SONAME = "libcudart.so.12"
RUNTIME_LINK = "libcudart.so"
"""What ``-lcudart`` finds, for programs linked against gpupool's runtime."""
BLAS_SOURCES = ("cublas.c",)
BLAS_FILES = ("cublas_refused.h", "cublas.map")
"""Included by cublas.c (the functions it refuses) and its version script."""
BLAS_SONAME = "libcublas.so.12"
BLAS_LINK = "libcublas.so"
"""What ``-lcublas`` finds, for programs linked against gpupool's cuBLAS."""
BLAS_LT_SOURCES = ("cublaslt.c",)
BLAS_LT_FILES = ("cublaslt.map",)
"""cublaslt.c's version script (the soname as the symbols' version, as cublas.map)."""
BLAS_LT_SONAME = "libcublasLt.so.12"
BLAS_LT_LINK = "libcublasLt.so"
"""What ``-lcublasLt`` finds, for programs linked against gpupool's cuBLASLt."""
PLACEHOLDER_SOURCES = ("local_share.c",)
PLACEHOLDER_NAME = "libgpupool-local-share.so"
"""The placeholder's file name and soname: anything but ``libcuda.so.1``, so the loader never
answers a program's ``libcuda.so.1`` with it (it is installed under that name in the pod)."""
HEADERS = ("protocol.h", "blas_checks.h")
"""Included by the server and the libraries: the wire format; the cuBLAS argument checks both apply."""
WARNINGS = ("-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter")
CLIENT_SONAME = "libcuda.so.1"
SERVER_LIBRARIES = ("-Wl,--no-as-needed", "-lssl", "-lcrypto")
"""TLS (OpenSSL 3). Named before the sources, hence --no-as-needed. The client loads libssl.so.3
only when it is given a CA, so it links against nothing but libc."""


def _files(names: tuple[str, ...]) -> list[Path]:
    return [REMOTE_DIR / name for name in names]


def build_server(*, flavour: Flavour = RELEASE, werror: bool = False) -> Path:
    """The GPU server executable (built once per digest)."""
    compiler = find_compiler()
    flags = (*WARNINGS, *flavour.flags, *(("-Werror",) if werror else ()), *SERVER_LIBRARIES)
    sources = _files(SERVER_SOURCES)
    output = cache_dir() / f"gpupool-remote-server-{flavour.name}-{_digest(compiler, flags, sources + _files(HEADERS))}"
    if not output.is_file():
        _compile(compiler, list(flags), sources, output)
    return output


def build_client(*, flavour: Flavour = RELEASE, werror: bool = False, grant_path: str | None = None) -> Path:
    """The directory holding the GPU client as ``libcuda.so.1`` (put it on ``LD_LIBRARY_PATH`` or
    mount it over the container's libcuda.so.1). ``grant_path`` compiles in another grant file
    than /etc/gpupool/grant (tests)."""
    compiler = find_compiler()
    defines = (f'-DSHIM_GRANT_PATH="{grant_path}"',) if grant_path is not None else ()
    flags = (*WARNINGS, "-fPIC", "-shared", "-fvisibility=hidden", *flavour.flags, *defines,
             f"-Wl,-soname,{CLIENT_SONAME}", *(("-Werror",) if werror else ()))
    sources = _files(CLIENT_SOURCES)
    runtime_sources = _files(RUNTIME_SOURCES)
    blas_sources = _files(BLAS_SOURCES)
    blas_lt_sources = _files(BLAS_LT_SOURCES)
    built_from = (sources + runtime_sources + blas_sources + blas_lt_sources + _files(HEADERS) + _files(RUNTIME_FILES)
                  + _files(BLAS_FILES) + _files(BLAS_LT_FILES))
    directory = cache_dir() / f"remote-client-{flavour.name}-{_digest(compiler, flags, built_from)}"
    target = directory / CLIENT_SONAME
    if not target.is_file():
        _compile(compiler, list(flags), sources, target)
    link = directory / "libcuda.so"
    if not link.exists():
        link.symlink_to(CLIENT_SONAME)
    _build_beside(compiler, flavour, werror, directory, runtime_sources, RUNTIME_SONAME, "cudart.map", RUNTIME_LINK)
    _build_beside(compiler, flavour, werror, directory, blas_sources, BLAS_SONAME, "cublas.map", BLAS_LINK)
    # cuBLASLt is linked to gpupool's cuBLAS beside it (the server's version, the status names)
    _build_beside(compiler, flavour, werror, directory, blas_lt_sources, BLAS_LT_SONAME, "cublaslt.map",
                  BLAS_LT_LINK, "-lcublas")
    return directory


def _build_beside(compiler: list[str], flavour: Flavour, werror: bool, directory: Path, sources: list[Path],
                  soname: str, version_script: str, link_name: str, *libraries: str) -> None:
    """Compile a library of gpupool's into the client's ``directory`` unless it is there, and the
    ``-l`` link to it (``link_name``) beside it."""
    library = directory / soname
    if not library.is_file():
        _compile(compiler, [*_library_flags(flavour, werror, soname, version_script), f"-L{directory}", *libraries],
                 sources, library)
    link = directory / link_name
    if not link.exists():
        link.symlink_to(soname)


def _library_flags(flavour: Flavour, werror: bool, soname: str, version_script: str) -> list[str]:
    """A library of gpupool's beside the client (its runtime, its cuBLAS): NVIDIA's soname, the
    version script's symbol version, linked to the driver (``libcuda.so.1``, looked for beside it
    first: the client's directory)."""
    return [*WARNINGS, "-fPIC", "-shared", "-fvisibility=hidden", *flavour.flags, f"-Wl,-soname,{soname}",
            f"-Wl,--version-script={REMOTE_DIR / version_script}", "-Wl,-rpath,$ORIGIN", "-Wl,--no-as-needed",
            "-lcuda", *(("-Werror",) if werror else ())]


def build_placeholder(*, flavour: Flavour = RELEASE, werror: bool = False) -> Path:
    """The local-share placeholder (built once per digest): defines no symbol, has no constructor."""
    compiler = find_compiler()
    flags = (*WARNINGS, "-fPIC", "-shared", "-fvisibility=hidden", *flavour.flags,
             f"-Wl,-soname,{PLACEHOLDER_NAME}", *(("-Werror",) if werror else ()))
    sources = _files(PLACEHOLDER_SOURCES)
    output = cache_dir() / f"local-share-{flavour.name}-{_digest(compiler, flags, sources)}" / PLACEHOLDER_NAME
    if not output.is_file():
        _compile(compiler, list(flags), sources, output)
    return output


def server_program() -> Path:
    """The GPU server the node runs: the packaged one, else a cached build."""
    packaged = PACKAGED_DIR / SERVER_NAME
    return packaged if packaged.is_file() else build_server()


def server_problem() -> str:
    """Why :func:`server_program` would fail here ("" when it would not): no packaged server and no
    C compiler to build one at the server's first start. Asked by the agent's start-up checks."""
    packaged = PACKAGED_DIR / SERVER_NAME
    if packaged.is_file():
        return ""
    try:
        find_compiler()
    except ShimBuildError:
        return f"no prebuilt GPU server at {packaged} and no C compiler to build one"
    return ""


def client_directory() -> Path:
    """The GPU client's directory: the packaged one, else a cached build."""
    packaged = PACKAGED_DIR / CLIENT_DIR_NAME
    return packaged if (packaged / CLIENT_SONAME).is_file() else build_client()


def placeholder_library() -> Path:
    """The local-share placeholder: the packaged one (beside the client), else a cached build."""
    packaged = PACKAGED_DIR / CLIENT_DIR_NAME / PLACEHOLDER_NAME
    return packaged if packaged.is_file() else build_placeholder()


def build_into(directory: Path) -> tuple[Path, Path]:
    """Build the programs and copy them into ``directory`` as an installation keeps them
    (``gpupool-remote-server``, ``remote-client/libcuda.so.1``, gpupool's ``libcudart.so.12``,
    ``libcublas.so.12`` and ``libcublasLt.so.12`` and the local-share placeholder beside the
    client); returns the server's path and the client's directory."""
    import shutil

    server, client, placeholder = build_server(), build_client(), build_placeholder()
    directory.mkdir(parents=True, exist_ok=True)
    server_target = directory / SERVER_NAME
    shutil.copy2(server, server_target)
    client_target = directory / CLIENT_DIR_NAME
    client_target.mkdir(exist_ok=True)
    shutil.copy2(client / CLIENT_SONAME, client_target / CLIENT_SONAME)
    shutil.copy2(client / RUNTIME_SONAME, client_target / RUNTIME_SONAME)
    shutil.copy2(client / BLAS_SONAME, client_target / BLAS_SONAME)
    shutil.copy2(client / BLAS_LT_SONAME, client_target / BLAS_LT_SONAME)
    shutil.copy2(placeholder, client_target / PLACEHOLDER_NAME)
    for link_name, target in (("libcuda.so", CLIENT_SONAME), (RUNTIME_LINK, RUNTIME_SONAME), (BLAS_LINK, BLAS_SONAME),
                              (BLAS_LT_LINK, BLAS_LT_SONAME)):
        link = client_target / link_name
        if not link.is_symlink():
            link.symlink_to(target)
    return server_target, client_target
