"""The programs real containers need: containerd, runc, CNI plugins, busybox and a C compiler.

All come from Debian's own packages (bookworm: containerd 1.6.20, whose CRI plugin serves the
``v1alpha2`` API that kubelet 1.20 speaks; runc 1.1.5; containernetworking-plugins 1.1.1;
busybox-static 1.35), installed with ``apt-get`` the way :mod:`gpupool.testenv.build` installs Go
and etcd: only when one is missing, only as root, with a clear :class:`BuildImpossibleError`
otherwise. Nothing is downloaded from anywhere else, so a CI machine that reaches only Debian's
registry runs real containers.
"""

from __future__ import annotations

import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

from gpupool.testenv.build import Log, exclusive_lock, run_step
from gpupool.testenv.errors import BuildImpossibleError
from gpupool.testenv.paths import cache_dir

#: Debian packages installed when a program of :data:`REQUIRED_PROGRAMS` is missing.
APT_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "busybox-static", "gcc",
                "libc6-dev", "iproute2")

#: Program name → where Debian installs it (``which`` is tried first).
REQUIRED_PROGRAMS = {
    "containerd": "/usr/bin/containerd",
    "ctr": "/usr/bin/ctr",
    "containerd-shim-runc-v2": "/usr/bin/containerd-shim-runc-v2",
    "runc": "/usr/sbin/runc",
    "busybox": "/bin/busybox",
    "gcc": "/usr/bin/gcc",
    "ip": "/usr/sbin/ip",
}

#: Where ``containernetworking-plugins`` puts the plugins (not on PATH).
CNI_BIN_DIR = Path("/usr/lib/cni")

#: The CNI plugins the test network uses.
CNI_PLUGINS = ("bridge", "host-local", "loopback")

#: ELF program header type of the loader request: a static program has none.
PT_INTERP = 3

#: The static C library, needed to link the pause binary statically.
STATIC_LIBC = Path("/usr/lib/x86_64-linux-gnu/libc.a")


@dataclass(frozen=True)
class RuntimeTools:
    """Absolute paths of the programs a containerd-backed kubelet uses."""

    containerd: Path
    ctr: Path
    runc: Path
    busybox: Path
    gcc: Path
    ip: Path
    cni_bin_dir: Path = CNI_BIN_DIR


def _program(name: str) -> Path | None:
    found = shutil.which(name) or REQUIRED_PROGRAMS[name]
    path = Path(found)
    return path if path.is_file() and os.access(path, os.X_OK) else None


def is_static_elf(path: Path) -> bool:
    """Whether ``path`` is a 64-bit ELF executable without a program interpreter (``PT_INTERP``).

    Debian's ``busybox`` package (dynamic) and ``busybox-static`` install the same path; only the
    static one runs in an image without a C library.
    """
    try:
        with path.open("rb") as fh:
            header = fh.read(64)
            if header[:5] != b"\x7fELF\x02":
                return False
            phoff, = struct.unpack_from("<Q", header, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
    except (OSError, struct.error):
        return False
    types = [struct.unpack_from("<I", table, i * phentsize)[0] for i in range(len(table) // phentsize)]
    return PT_INTERP not in types


def missing_programs() -> list[str]:
    """What is not installed yet (programs, CNI plugins, the static libc), by name."""
    missing = [name for name in REQUIRED_PROGRAMS if _program(name) is None]
    busybox = _program("busybox")
    if busybox is not None and not is_static_elf(busybox):
        missing.append("busybox (statically linked)")
    missing += [f"cni/{p}" for p in CNI_PLUGINS if not (CNI_BIN_DIR / p).is_file()]
    if not STATIC_LIBC.is_file():
        missing.append(str(STATIC_LIBC))
    return missing


def find_runtime_tools() -> RuntimeTools | None:
    """The installed tools, or ``None`` if any is missing (a few ``stat`` calls)."""
    if missing_programs():
        return None
    paths = {name.replace("-", "_"): _program(name) for name in ("containerd", "ctr", "runc", "busybox", "gcc", "ip")}
    return RuntimeTools(**{k: v for k, v in paths.items() if v is not None})


def runtime_impossible_reason() -> str | None:
    """Why real containers can never run here, or ``None`` if they might (see :func:`ensure_runtime_tools`)."""
    missing = missing_programs()
    if not missing:
        return None
    if shutil.which("apt-get") is None:
        return f"{', '.join(missing)} missing and no apt-get to install them"
    if os.geteuid() != 0:
        return f"{', '.join(missing)} missing and not running as root, so cannot apt-get install them"
    return None


def ensure_runtime_tools(log: Log = lambda _: None) -> RuntimeTools:
    """Return the tools, installing Debian's packages first when any is missing.

    Raises :class:`BuildImpossibleError` when they cannot be installed (not root, no apt, no route
    to Debian's registry); the message names the apt log.
    """
    found = find_runtime_tools()
    if found is not None:
        return found
    reason = runtime_impossible_reason()
    if reason is not None:
        raise BuildImpossibleError(reason)
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache_dir() / ".runtime-install.lock", log):
        if find_runtime_tools() is None:
            _apt_install(logs, log)
    found = find_runtime_tools()
    if found is None:
        raise BuildImpossibleError(f"still missing after apt-get install: {', '.join(missing_programs())}")
    return found


def _apt_install(logs: Path, log: Log) -> None:
    """``apt-get install`` the packages; on failure refresh the package lists once and retry."""
    log(f"installing {' '.join(APT_PACKAGES)} with apt-get (log: {logs / 'apt-install-runtime.log'})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *APT_PACKAGES]
    try:
        run_step(cmd, logs / "apt-install-runtime.log", env=env, failure=BuildImpossibleError,
                 step="apt-get install (container runtime)")
    except BuildImpossibleError:
        run_step(["apt-get", "update"], logs / "apt-update-runtime.log", env=env,
                 failure=BuildImpossibleError, step="apt-get update")
        run_step(cmd, logs / "apt-install-runtime.log", env=env, failure=BuildImpossibleError,
                 step="apt-get install (container runtime)")
