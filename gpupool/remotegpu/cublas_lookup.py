"""Which NVIDIA cuBLAS the GPU server runs the clients' cuBLAS calls on (docs/remote-gpu.md, "cuBLAS").

gpupool's image ships no cuBLAS, so where one is differs per node: a file the admin names, NVIDIA's
``nvidia-cublas-cu12`` wheel installed next to gpupool, or a CUDA toolkit on the library path. The
C server would only ``dlopen`` whatever it is told and fail at a client's first call, long after
start; looking here, once, lets ``gpupool remote-gpu serve`` say in its log at start which library
answers cuBLAS calls, or that none was found and they will be refused (``CUBLAS_STATUS_NOT_INITIALIZED``).

The order: ``--cublas`` (the node agent's ``--remote-gpu-cublas``); ``GPUPOOL_REMOTE_CUBLAS``; the
wheel's ``nvidia/cublas/lib/libcublas.so.12`` in this Python environment (found by
:func:`importlib.util.find_spec`, which imports nothing of CUDA: the wheel's packages hold no code);
the soname on the library path (``LD_LIBRARY_PATH``, the loader's cache, the default directories).
A chosen file is handed to the C server as ``--cublas``; for the soname the server's own ``dlopen``
finds the same file. ``libcublas.so.12`` needs ``libcublasLt.so.12``: the C server runs with the
chosen file's directory first on its ``LD_LIBRARY_PATH`` (:meth:`CublasChoice.server_environment`),
so the one beside it is found whether or not the copy carries a RUNPATH, and a chosen file without
one beside it is warned about.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path

from gpupool.shim.remote_build import BLAS_LT_SONAME as BLAS_LT_SONAME  # cuBLAS needs it: beside it or on the path
from gpupool.shim.remote_build import BLAS_SONAME

CUBLAS_ENV = "GPUPOOL_REMOTE_CUBLAS"
WHEEL_PACKAGE = "nvidia.cublas"
"""The package of NVIDIA's ``nvidia-cublas-cu12`` wheel; its libraries are in ``lib/``."""
DEFAULT_LIBRARY_DIRS = ("/lib64", "/usr/lib64", "/lib", "/usr/lib")


@dataclass(frozen=True)
class CublasChoice:
    """The cuBLAS the server will load and why; ``path`` None: nothing found."""

    path: str | None
    source: str
    """Where it came from, as the log says it: ``--cublas``, ``GPUPOOL_REMOTE_CUBLAS``, ..."""
    server_argument: str | None = None
    """What the C server gets as ``--cublas`` (None: its default, the soname)."""

    def problems(self) -> list[str]:
        """What will keep this choice from loading that can be seen now (a file that is not there,
        no cuBLASLt beside it)."""
        if self.path is None or "/" not in self.path:
            return []
        library = Path(self.path)
        if not library.is_file():
            return [f"{library} does not exist"]
        if not (library.parent / BLAS_LT_SONAME).exists():
            return [f"no {BLAS_LT_SONAME} beside it: the loader must find one elsewhere on the library path"]
        return []

    def server_environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The C server's environment: ``environ`` with the chosen file's directory first on
        ``LD_LIBRARY_PATH``, so the loader finds the ``libcublasLt.so.12`` beside it whether or not
        that copy carries a RUNPATH (a CUDA toolkit's ``lib64`` mounted from the host may not)."""
        env = dict(environ)
        if self.path is not None and "/" in self.path:
            directory = str(Path(self.path).parent)
            rest = env.get("LD_LIBRARY_PATH", "")
            env["LD_LIBRARY_PATH"] = f"{directory}:{rest}" if rest else directory
        return env

    def describe(self) -> str:
        """The one line the server logs at start."""
        if self.path is None:
            return (f"remote GPU: no cuBLAS found ({BLAS_SONAME}: not given with --cublas or {CUBLAS_ENV}, no "
                    f"nvidia-cublas-cu12 wheel in this Python, not on the library path): the clients' cuBLAS calls "
                    "will be refused with CUBLAS_STATUS_NOT_INITIALIZED")
        line = f"remote GPU: cuBLAS calls run on {self.path} ({self.source})"
        problems = self.problems()
        return f"{line}; {'; '.join(problems)}" if problems else line


def wheel_library(find_spec: Callable[[str], ModuleSpec | None] = importlib.util.find_spec) -> Path | None:
    """The ``nvidia-cublas-cu12`` wheel's ``libcublas.so.12`` in this Python's path, or None."""
    try:
        spec = find_spec(WHEEL_PACKAGE)
    except (ImportError, ValueError):
        return None
    for directory in (spec.submodule_search_locations or []) if spec is not None else []:
        library = Path(directory) / "lib" / BLAS_SONAME
        if library.is_file():
            return library
    return None


def loader_cache(name: str) -> Path | None:
    """Where the loader's cache (``ldconfig -p``) puts ``name``, or None (no ldconfig, not listed)."""
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in listing.splitlines():
            soname, arrow, path = line.strip().partition(" => ")
            if arrow and soname.split(" ", 1)[0] == name:
                return Path(path)
        return None
    return None


def on_library_path(name: str, environ: Mapping[str, str] | None = None,
                    cache: Callable[[str], Path | None] = loader_cache,
                    default_dirs: Iterable[str] = DEFAULT_LIBRARY_DIRS) -> Path | None:
    """Where the loader would find ``name``: ``LD_LIBRARY_PATH``'s directories, its cache, then the
    default directories; None when in none of them."""
    environ = os.environ if environ is None else environ
    for directory in filter(None, environ.get("LD_LIBRARY_PATH", "").split(":")):
        if (Path(directory) / name).is_file():
            return Path(directory) / name
    cached = cache(name)
    if cached is not None:
        return cached
    return next((Path(d) / name for d in default_dirs if (Path(d) / name).is_file()), None)


def find_cublas(flag: str | None = None, environ: Mapping[str, str] | None = None,
                wheel: Callable[[], Path | None] = wheel_library,
                library_path: Callable[[str], Path | None] | None = None) -> CublasChoice:
    """The cuBLAS the server is to load, in the module docstring's order."""
    environ = os.environ if environ is None else environ
    if flag:
        return CublasChoice(flag, "--cublas", flag)
    named = environ.get(CUBLAS_ENV, "")
    if named:
        return CublasChoice(named, CUBLAS_ENV, named)
    found = wheel()
    if found is not None:
        return CublasChoice(str(found), "the nvidia-cublas-cu12 wheel", str(found))
    found = (library_path or (lambda name: on_library_path(name, environ)))(BLAS_SONAME)
    if found is not None:
        return CublasChoice(str(found), f"{BLAS_SONAME} on the library path")
    return CublasChoice(None, "none")
