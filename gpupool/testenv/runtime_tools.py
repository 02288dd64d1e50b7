"""The programs real containers need: containerd 2 (with its runc shim and ``ctr``), runc, the CNI
plugins, busybox, a C compiler and ``ip``.

Two sources, each the one that works for every supported Kubernetes release:

* **Built from pinned Go modules** (:mod:`gpupool.testenv.versions`, built by
  :mod:`gpupool.testenv.gobuild` into the cache): containerd, ``containerd-shim-runc-v2`` and
  ``ctr`` (``github.com/containerd/containerd/v2``), runc (``github.com/opencontainers/runc``) and
  the CNI plugins ``bridge``, ``host-local`` and ``loopback``
  (``github.com/containernetworking/plugins``). Kubelets of the newest minors refuse containerd
  1.x, and Debian bookworm ships 1.6, so the runtime comes from the same Go toolchain and module
  proxy as Kubernetes itself; nothing is taken from ``$PATH``, so an old containerd or shim
  installed on the machine is never picked up by mistake.
* **Debian packages** (``apt-get``, only when missing, only as root): ``busybox-static`` (the
  images' shell), ``gcc`` and ``libc6-dev`` (the static pause binary, and the C code of runc's
  ``nsenter``, which needs cgo), ``libseccomp-dev`` and ``pkg-config`` (runc's seccomp support)
  and ``iproute2`` (the pod bridge).

runc is built **with** seccomp (upstream's default ``seccomp`` build tag, linked against Debian's
libseccomp): kubelet asks for ``RuntimeDefault`` seccomp for every pod's sandbox (pause)
container whatever the pod says, and a runc without seccomp refuses it ("config provided but
seccomp not supported"), so no pod would start. It is built without ``libpathrs`` (a Rust library;
runc then uses its pure-Go replacement).

containerd and the CNI plugins build without cgo (as their static releases do); the btrfs, zfs and
devmapper snapshotters and the OpenTelemetry tracing plugin are left out by build tags, since none
can work here and each only logs errors at start.
"""

from __future__ import annotations

import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

from gpupool.testenv.errors import BuildImpossibleError
from gpupool.testenv.gobuild import GoBuild, GoProgram, build, ensure_built, toolchain_problem, wrapper_go_mod
from gpupool.testenv.paths import cache_dir
from gpupool.testenv.steps import Log, apt_install, exclusive_lock, quiet, run_step
from gpupool.testenv.versions import CNI_PLUGINS, CONTAINERD, RUNC

#: Debian packages installed when a program of :data:`APT_PROGRAMS` or a file of :data:`APT_FILES`
#: is missing.
APT_PACKAGES = ("busybox-static", "gcc", "libc6-dev", "libseccomp-dev", "pkg-config", "iproute2")

#: Program name → where Debian installs it (``which`` is tried first).
APT_PROGRAMS = {
    "busybox": "/bin/busybox",
    "gcc": "/usr/bin/gcc",
    "pkg-config": "/usr/bin/pkg-config",
    "ip": "/usr/sbin/ip",
}

CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
RUNC_MODULE = "github.com/opencontainers/runc"
CNI_MODULE = "github.com/containernetworking/plugins"

#: containerd's build tags: no btrfs/zfs/devmapper snapshotters and no tracing plugin (none can
#: work here; each logs errors at start), no CLI documentation generator in ``ctr``.
CONTAINERD_TAGS = ("no_btrfs", "no_zfs", "no_devmapper", "no_tracing", "urfave_cli_no_docs")

#: runc's build tags: upstream's default minus ``libpathrs`` (needs the Rust library).
RUNC_TAGS = ("seccomp", "urfave_cli_no_docs")

#: The CNI plugins the test network uses (binary name → package in :data:`CNI_MODULE`).
CNI_PROGRAMS = {
    "bridge": "plugins/main/bridge",
    "host-local": "plugins/ipam/host-local",
    "loopback": "plugins/main/loopback",
}

#: The containerd shim binary; containerd finds it on its ``$PATH`` (see :attr:`RuntimeTools.path`).
SHIM = "containerd-shim-runc-v2"

#: ELF program header type of the loader request: a static program has none.
PT_INTERP = 3

#: The static C library, needed to link the pause binary statically.
STATIC_LIBC = Path("/usr/lib/x86_64-linux-gnu/libc.a")

#: Files (not programs) the builds need from apt: the static libc, libseccomp's header for runc.
APT_FILES = (STATIC_LIBC, Path("/usr/include/seccomp.h"))

#: The runtime builds take their own lock, so they need not wait behind a Kubernetes build.
BUILD_LOCK = ".runtime-build.lock"


@dataclass(frozen=True)
class RuntimeTools:
    """Absolute paths of the programs a containerd-backed kubelet uses."""

    containerd: Path
    ctr: Path
    runc: Path
    busybox: Path
    gcc: Path
    ip: Path
    cni_bin_dir: Path

    @property
    def shim(self) -> Path:
        """``containerd-shim-runc-v2``, built next to containerd."""
        return self.containerd.parent / SHIM

    @property
    def path(self) -> str:
        """The ``$PATH`` containerd runs with: its own directory (the shim) and runc's first, so
        that a shim or runc installed on the machine is never the one used."""
        dirs = [str(self.containerd.parent), str(self.runc.parent)]
        dirs += [d for d in os.environ.get("PATH", os.defpath).split(os.pathsep) if d and d not in dirs]
        return os.pathsep.join(dirs)


def containerd_build() -> GoBuild:
    """containerd, its runc shim and ``ctr``, one cache entry (``version`` shows the pinned tag).

    ``go.mod`` says ``go 1.26.6`` at v2.4.2; the wrapper's ``go`` line is raised to the highest a
    dependency names by ``go build -mod=mod`` itself.
    """
    programs = (GoProgram("containerd", f"{CONTAINERD_MODULE}/cmd/containerd"),
                GoProgram(SHIM, f"{CONTAINERD_MODULE}/cmd/{SHIM}"),
                GoProgram("ctr", f"{CONTAINERD_MODULE}/cmd/ctr"))
    return GoBuild(key=f"containerd-{CONTAINERD}", go_mod=wrapper_go_mod([(CONTAINERD_MODULE, CONTAINERD)]),
                   programs=programs, tags=CONTAINERD_TAGS,
                   ldflags=f"-s -w -X {CONTAINERD_MODULE}/version.Version={CONTAINERD}")


def runc_build() -> GoBuild:
    """runc with cgo (its ``nsenter`` and libseccomp's bindings are C; ``go.mod``: ``go 1.25.0`` at
    v1.5.3; the version it reports comes from its embedded ``VERSION`` file)."""
    return GoBuild(key=f"runc-{RUNC}", go_mod=wrapper_go_mod([(RUNC_MODULE, RUNC)]),
                   programs=(GoProgram("runc", RUNC_MODULE),), tags=RUNC_TAGS, cgo=True)


def cni_build() -> GoBuild:
    """The three CNI plugins (``go.mod``: ``go 1.26.8`` at v1.10.0, so they need Go 1.26.8)."""
    programs = tuple(GoProgram(name, f"{CNI_MODULE}/{package}") for name, package in CNI_PROGRAMS.items())
    return GoBuild(key=f"cni-plugins-{CNI_PLUGINS}", go_mod=wrapper_go_mod([(CNI_MODULE, CNI_PLUGINS)]),
                   programs=programs,
                   ldflags=f"-s -w -X {CNI_MODULE}/pkg/utils/buildversion.BuildVersion={CNI_PLUGINS}")


def go_builds() -> tuple[GoBuild, ...]:
    """Every Go build of the runtime, cheapest first (so a failure shows up early)."""
    return (cni_build(), runc_build(), containerd_build())


def _apt_program(name: str) -> Path | None:
    found = shutil.which(name) or APT_PROGRAMS[name]
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


def missing_packages() -> list[str]:
    """What apt must install (programs, the static libc, libseccomp's header), by name."""
    missing = [name for name in APT_PROGRAMS if _apt_program(name) is None]
    busybox = _apt_program("busybox")
    if busybox is not None and not is_static_elf(busybox):
        missing.append("busybox (statically linked)")
    missing += [str(path) for path in APT_FILES if not path.is_file()]
    return missing


def missing_builds() -> list[str]:
    """The Go builds whose cache entry is not complete, by key (``containerd-v2.4.2`` ...)."""
    return [spec.key for spec in go_builds() if not spec.is_built()]


def missing_programs() -> list[str]:
    """Everything not in place yet: apt's programs, then the Go builds."""
    return missing_packages() + missing_builds()


def find_runtime_tools() -> RuntimeTools | None:
    """The tools, or ``None`` if anything is missing (a few ``stat`` calls and stamp reads)."""
    if missing_programs():
        return None
    apt = {name: _apt_program(name) for name in ("busybox", "gcc", "ip")}
    busybox, gcc, ip = apt["busybox"], apt["gcc"], apt["ip"]
    if busybox is None or gcc is None or ip is None:
        return None
    containerd, runc = containerd_build().paths(), runc_build().paths()
    return RuntimeTools(containerd=containerd["containerd"], ctr=containerd["ctr"], runc=runc["runc"],
                        busybox=busybox, gcc=gcc, ip=ip, cni_bin_dir=cni_build().bin_dir())


def runtime_impossible_reason() -> str | None:
    """Why real containers can never run here, or ``None`` if they might (see :func:`ensure_runtime_tools`)."""
    packages = missing_packages()
    if packages and shutil.which("apt-get") is None:
        return f"{', '.join(packages)} missing and no apt-get to install them"
    if packages and os.geteuid() != 0:
        return f"{', '.join(packages)} missing and not running as root, so cannot apt-get install them"
    if missing_builds():
        problem = toolchain_problem()
        if problem is not None:
            return f"{', '.join(missing_builds())} not built and cannot be: {problem}"
    return None


def ensure_runtime_tools(log: Log = quiet) -> RuntimeTools:
    """Return the tools, installing Debian's packages and building the Go programs first when any
    is missing (a cold build takes minutes; a warm call only checks stamps).

    Raises :class:`~gpupool.testenv.errors.BuildImpossibleError` when something cannot be
    installed or built here (not root, no apt, no Go, no route to a registry) and
    :class:`~gpupool.testenv.errors.BuildFailedError` when a build fails; both name the step and
    its log.
    """
    found = find_runtime_tools()
    if found is not None:
        return found
    reason = runtime_impossible_reason()
    if reason is not None:
        raise BuildImpossibleError(reason)
    if missing_packages():  # first: runc's cgo needs gcc, libc6-dev and libseccomp-dev
        logs = cache_dir() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(cache_dir() / ".runtime-install.lock", log):
            if missing_packages():
                apt_install(APT_PACKAGES, "runtime", logs, log, run=run_step)

    def make(logs: Path) -> None:
        for spec in go_builds():  # each one built by another process meanwhile returns at once
            build(spec, logs=logs, log=log)

    # The machine's ability to build was judged above, packages included.
    return ensure_built(find_runtime_tools, make, what="containerd, runc and the CNI plugins",
                        lock_name=BUILD_LOCK, problem=lambda: None, lock=exclusive_lock, log=log)
