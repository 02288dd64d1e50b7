"""The driver's user-space libraries handed to every GPU container, so GPU pods run under plain runc.

Why: without the NVIDIA container runtime (or its hook, or CDI) nothing puts ``libcuda.so.1`` and
``libnvidia-ml.so.1`` into a container; an image built on a plain base then finds no driver. Seed
004's rule (GPUManager): the device plugin's Allocate itself mounts the host's driver libraries and
sets ``LD_LIBRARY_PATH``. With ``--driver-libraries`` the agent does that for every grant:

* ``host``: the libraries the dynamic linker's cache knows (``ldconfig -p``), found by the names the
  NVIDIA container toolkit looks for (its "utility" and "compute" sets), 64-bit entries only;
* a directory: every file there whose name starts with one of those names (an admin's copy of the
  driver, or the stand-in driver the tests build).

Each library is bind-mounted read-only into :data:`CONTAINER_DIR` under the name programs load it
by (its soname: ``libcuda.so.1``, the target of a symlink resolved on the host), and
``LD_LIBRARY_PATH`` names that directory. Not handed out: binaries (``nvidia-smi``), graphics,
video and display libraries, firmware. A pod that sets ``LD_LIBRARY_PATH`` itself overrides the
agent's value (kubelet lists the pod's variables after the device plugin's, and containerd keeps the
last) and must name :data:`CONTAINER_DIR` too.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpupool.nodeagent.isolation.backends import Enforcement, EnforcementState, LivePods
from gpupool.nodeagent.types import GrantExtras, Mount, PodView

CONTAINER_DIR = "/usr/local/gpupool/driver/lib"
"""Where the libraries appear in the container (a path no image ships)."""
LIBRARY_PATH_ENV = "LD_LIBRARY_PATH"
HOST = "host"
NONE = "none"

DRIVER_LIBRARY_NAMES = (
    "libnvidia-ml.so", "libnvidia-cfg.so",  # utility
    "libcuda.so", "libcudadebugger.so", "libnvidia-opencl.so", "libnvidia-gpucomp.so",  # compute
    "libnvidia-ptxjitcompiler.so", "libnvidia-fatbinaryloader.so", "libnvidia-allocator.so",
    "libnvidia-compiler.so", "libnvidia-nvvm.so", "libnvidia-pkcs11.so", "libnvidia-pkcs11-openssl3.so",
)
"""The library names (a file name starts with one and a dot or the end follows) the NVIDIA container
toolkit mounts for its ``utility`` and ``compute`` driver capabilities."""

LDCONFIG_TIMEOUT_S = 10


class DriverLibraryError(RuntimeError):
    """The driver's libraries cannot be found where the flag says; the message says where it looked."""


def is_driver_library(name: str) -> bool:
    """Whether a file name is one of :data:`DRIVER_LIBRARY_NAMES` (``libcuda.so``, ``libcuda.so.1``,
    ``libcuda.so.550.54.15``; not ``libcudart.so.12``)."""
    return any(name == base or name.startswith(base + ".") for base in DRIVER_LIBRARY_NAMES)


def parse_ldconfig(text: str) -> dict[str, str]:
    """Soname → path of the 64-bit driver libraries in ``ldconfig -p``'s output (lines such as
    ``\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1``); the first entry of
    a name wins, as the dynamic linker takes it."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        name, arrow, path = line.strip().partition(" => ")
        if not arrow:
            continue
        soname, _, flags = name.partition(" (")
        if not is_driver_library(soname) or "64" not in flags:
            continue
        found.setdefault(soname, path.strip())
    return found


@dataclass(frozen=True)
class DriverLibraries:
    """The libraries every grant mounts: container file name → host file."""

    files: Mapping[str, str]
    source: str
    """Where they were found, for the agent's log."""

    def extras(self) -> GrantExtras:
        """The mounts and ``LD_LIBRARY_PATH`` a grant gets."""
        mounts = tuple(Mount(host, f"{CONTAINER_DIR}/{name}", read_only=True)
                       for name, host in sorted(self.files.items()))
        return GrantExtras(envs={LIBRARY_PATH_ENV: CONTAINER_DIR}, mounts=mounts)


def _resolved(files: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Each name to the real file behind it (a bind mount of a symlink would mount its target
    anyway; resolving here names what is mounted and drops dangling links)."""
    out: dict[str, str] = {}
    for name, path in files:
        real = os.path.realpath(path)
        if os.path.isfile(real):
            out[name] = real
    return out


def from_directory(directory: str) -> DriverLibraries:
    """Every driver library in ``directory`` (see the module doc)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise DriverLibraryError(f"--driver-libraries {directory}: {exc.strerror or exc}") from None
    files = _resolved((name, os.path.join(directory, name)) for name in names if is_driver_library(name))
    if not files:
        raise DriverLibraryError(f"--driver-libraries {directory}: no driver library there (looked for "
                                 f"{', '.join(DRIVER_LIBRARY_NAMES[:3])}, ...)")
    return DriverLibraries(files, directory)


def from_host(ldconfig: str = "ldconfig") -> DriverLibraries:
    """The driver libraries the host's dynamic linker cache knows (``ldconfig -p``)."""
    try:
        done = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=LDCONFIG_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DriverLibraryError(f"--driver-libraries host: cannot run {ldconfig} -p: {exc}") from None
    files = _resolved(parse_ldconfig(done.stdout).items())
    if "libcuda.so.1" not in files:
        raise DriverLibraryError("--driver-libraries host: the dynamic linker's cache (ldconfig -p) has no "
                                 "64-bit libcuda.so.1: is the NVIDIA driver installed? Name its directory "
                                 "instead (--driver-libraries DIR)")
    return DriverLibraries(files, "the dynamic linker's cache (ldconfig -p)")


def driver_libraries(choice: str) -> DriverLibraries | None:
    """What ``--driver-libraries`` names: nothing (``none``), the host's (``host``) or a directory."""
    if choice == NONE:
        return None
    return from_host() if choice == HOST else from_directory(choice)


class DriverLibrariesEnforcement:
    """The node's enforcement backend with the driver's libraries added to every grant (the
    backend's own variables and mounts win a clash: it decides what a container loads first)."""

    def __init__(self, inner: Enforcement, libraries: DriverLibraries) -> None:
        self._inner = inner
        self._extras = libraries.extras()
        self.registry = getattr(inner, "registry", None)  # the library's registrations, for the report

    def grant_extras(self, pod: PodView, container: str) -> GrantExtras:
        base = self._inner.grant_extras(pod, container)
        taken = {m.container_path for m in base.mounts}
        ours = tuple(m for m in self._extras.mounts if m.container_path not in taken)
        return GrantExtras(envs={**self._extras.envs, **base.envs}, mounts=(*base.mounts, *ours))

    def state(self) -> EnforcementState:
        return self._inner.state()

    async def run(self, live_pods: LivePods) -> None:
        await self._inner.run(live_pods)
