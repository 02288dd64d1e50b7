"""Build the interception library (and the stand-in driver its tests use) from the shipped sources.

Built files are named by a digest of the compiler, the flags and every source file, so a changed
source or compiler never reuses a stale library, two checkouts sharing the cache never overwrite
each other's file, and a rebuild never replaces a library a running container has mapped. The
cache is ``$GPUPOOL_SHIM_CACHE``, else ``$XDG_CACHE_HOME/gpupool/shim``, else
``~/.cache/gpupool/shim``. An installation may instead carry a prebuilt library in the package
(``gpupool/shim/lib/``, what the Docker image does), which then wins.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpupool.shim.region import SLOTS as REGION_SLOTS

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_DIR = PACKAGE_DIR / "src"
STANDIN_DIR = SOURCE_DIR / "standin"
#: Where an installation keeps a prebuilt library (the Docker image writes it there).
PACKAGED_LIBRARY = PACKAGE_DIR / "lib" / "libgpupool-shim.so"
LIBRARY_STEM = "libgpupool-shim"
CACHE_ENV = "GPUPOOL_SHIM_CACHE"
DIGEST_LENGTH = 16
COMPILE_TIMEOUT_S = 300
#: The stand-in driver's files, by the sonames programs look for.
STANDIN_LIBRARIES = {"libcuda.so.1": ("cuda.c", "vmm.c", "graph.c", "events.c", "kernels.c", "teardown.c"),
                     "libnvidia-ml.so.1": ("nvml.c",)}

NO_COMPILER = (
    "no C compiler found (looked for $CC, cc, gcc, clang): the interception library is built from C "
    "sources on the node. Install one (Debian/Ubuntu: apt-get install gcc libc6-dev) or set CC."
)

COMMON_FLAGS = ("-std=gnu11", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra",
                "-Wno-unused-parameter")
LINK_FLAGS = ("-ldl", "-lpthread")


class ShimBuildError(RuntimeError):
    """The library could not be built; the message says why and what to do."""


@dataclass(frozen=True)
class Flavour:
    """A set of compiler flags the library is built with."""

    name: str
    flags: tuple[str, ...]


RELEASE = Flavour("release", ("-O2", "-g"))
#: AddressSanitizer and UndefinedBehaviorSanitizer, for the library's own tests.
SANITIZED = Flavour("asan", ("-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                             "-fno-sanitize-recover=undefined"))


def find_compiler() -> list[str]:
    """The C compiler command: ``$CC`` (which may carry flags), else cc, gcc or clang on PATH."""
    configured = os.environ.get("CC", "").strip()
    if configured:
        command = shlex.split(configured)
        if shutil.which(command[0]) is None:
            raise ShimBuildError(f"CC={configured!r} is not an executable on PATH. {NO_COMPILER}")
        return command
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    raise ShimBuildError(NO_COMPILER)


def cache_dir() -> Path:
    """Where built libraries are kept (see the module's docstring)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpupool" / "shim"


def library_sources() -> list[Path]:
    """The C files of the interception library."""
    return sorted(SOURCE_DIR.glob("*.c"))


def _digest(compiler: list[str], flags: tuple[str, ...], files: list[Path]) -> str:
    digest = hashlib.sha256()
    digest.update("\0".join([*compiler, *flags]).encode())
    for path in sorted({*files, *SOURCE_DIR.glob("*.h"), *STANDIN_DIR.glob("*.h")}):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:DIGEST_LENGTH]


def _compile(compiler: list[str], flags: list[str], sources: list[Path], output: Path, *,
             link_flags: tuple[str, ...] = LINK_FLAGS, hint: str = "") -> None:
    """Compile into a temporary file next to ``output`` and rename it: readers never see half a file.
    ``hint`` is added to the failure's first line (what a failed build of this kind usually lacks)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    os.close(fd)
    command = [*compiler, *flags, "-o", temporary, *map(str, sources), *link_flags]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        Path(temporary).unlink(missing_ok=True)
        raise ShimBuildError(f"running {compiler[0]} failed: {exc}") from exc
    if done.returncode != 0:
        Path(temporary).unlink(missing_ok=True)
        raise ShimBuildError(f"{shlex.join(command)} failed{f' ({hint})' if hint else ''}:\n{done.stderr[-4000:]}")
    os.chmod(temporary, 0o755)
    os.replace(temporary, output)


def build_library(output: Path | None = None, *, flavour: Flavour = RELEASE, werror: bool = False,
                  grant_path: str | None = None, region_slots: int | None = None) -> Path:
    """Build the interception library and return its path.

    Without ``output`` the library goes to the cache under a digest-named file, and an existing one
    is returned without compiling. ``werror`` turns warnings into errors (the tests use it).
    ``grant_path`` compiles in another place for the node's grant file than the container path of
    :data:`gpupool.api.shim_contract.CONTAINER_GRANT_PATH`: only for tests, which cannot write that
    path; the grant's path is never read from the environment, so a container cannot move it.
    ``region_slots`` compiles a smaller process table into ``memory.region`` than the format's 256:
    only for tests, which then fill it with a few processes instead of hundreds.
    """
    compiler = find_compiler()
    defines: tuple[str, ...] = ()
    if grant_path is not None:
        if not grant_path.startswith("/") or any(c in grant_path for c in '"\\\n'):
            raise ShimBuildError(f"grant path {grant_path!r}: expected an absolute path without quotes or backslashes")
        defines = (f'-DSHIM_GRANT_PATH="{grant_path}"',)
    if region_slots is not None:
        if not 0 < region_slots <= REGION_SLOTS:
            raise ShimBuildError(f"region_slots {region_slots}: expected 1 to {REGION_SLOTS}")
        defines = (*defines, f"-DSHIM_REGION_SLOTS={region_slots}")
    flags = (*COMMON_FLAGS, *flavour.flags, *defines, *(("-Werror",) if werror else ()))
    sources = library_sources()
    if output is None:
        kind = f"{flavour.name}-granted" if grant_path is not None else flavour.name
        kind += f"-slots{region_slots}" if region_slots is not None else ""
        output = cache_dir() / f"{LIBRARY_STEM}-{kind}-{_digest(compiler, flags, sources)}.so"
        if output.is_file():
            return output
    _compile(compiler, list(flags), sources, output)
    return output


def library_path(*, build: bool = True) -> Path:
    """The library the node agent mounts into containers: the packaged one, else a cached build.

    Raises :class:`ShimBuildError` when there is none and it cannot be built (or ``build`` is
    false).
    """
    if PACKAGED_LIBRARY.is_file():
        return PACKAGED_LIBRARY
    if not build:
        raise ShimBuildError(f"no prebuilt library at {PACKAGED_LIBRARY}; run `gpupool shim build`")
    return build_library()


def build_standin(output_dir: Path | None = None, *, flavour: Flavour = RELEASE, werror: bool = False) -> Path:
    """Build the stand-in driver (``libcuda.so.1`` and ``libnvidia-ml.so.1``) for tests; returns
    the directory that holds them (put it on ``LD_LIBRARY_PATH``)."""
    compiler = find_compiler()
    flags = (*COMMON_FLAGS, *flavour.flags, "-Wl,-Bsymbolic", *(("-Werror",) if werror else ()))
    shared = STANDIN_DIR / "state.c"
    all_sources = [STANDIN_DIR / source for sources in STANDIN_LIBRARIES.values() for source in sources] + [shared]
    if output_dir is None:
        output_dir = cache_dir() / f"standin-{flavour.name}-{_digest(compiler, flags, all_sources)}"
    for soname, sources in STANDIN_LIBRARIES.items():
        target = output_dir / soname
        if not target.is_file():
            _compile(compiler, [*flags, f"-Wl,-soname,{soname}"], [*(STANDIN_DIR / s for s in sources), shared], target)
    link = output_dir / "libcuda.so"  # what `-lcuda` looks for when a test program links against it
    if not link.exists():
        link.symlink_to("libcuda.so.1")
    return output_dir
