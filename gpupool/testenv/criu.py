"""CRIU for the process-checkpoint tests: version 4.1.1, built once into the cache, statically linked.

Why build it: Debian bookworm ships CRIU 3.17, whose restore of a process tree needs
``/proc/sys/kernel/ns_last_pid`` (read-only in a container) on this kernel, and links a dozen shared
libraries that a busybox image does not have. CRIU 4.1.1 (Debian trixie's source) restores process ids
with ``clone3``'s ``set_tid`` and, linked statically, runs in any image: the checkpoint wrapper
(``gpupool/shim/src/criu_run``) runs it *inside* the workload's container, since the pinned
containerd (2.4) no longer restores containers through the CRI.

Where things come from, each through apt's own client and nothing else on the machine changed:

* the source: ``apt-get source --download-only --tar-only criu`` with a private apt configuration
  (one ``deb-src`` line for trixie; its own lists and cache directories under the build directory),
  the tarball's SHA-256 pinned (:data:`ORIG_SHA256`);
* the libraries CRIU links (protobuf-c, libnl-3, libnet) and the ``protoc-c`` compiler its build runs:
  bookworm's ``-dev`` packages fetched with ``apt-get download`` and unpacked with ``dpkg -x`` into a
  sysroot, never installed; CRIU links their static archives.

``make criu`` takes about 35 s on two cores. Nothing is built until a test asks for it
(:func:`ensure_criu`); a warm call checks one stamp.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from gpupool.testenv.errors import BuildFailedError, BuildImpossibleError
from gpupool.testenv.gobuild import ensure_built
from gpupool.testenv.paths import cache_dir
from gpupool.testenv.runtime_tools import STATIC_LIBC, is_static_elf
from gpupool.testenv.steps import Log, exclusive_lock, quiet, run_step

VERSION = "4.1.1"
DEBIAN_VERSION = f"{VERSION}-1"
"""trixie's package; its source package names the tarball below."""
ORIG_TARBALL = f"criu_{VERSION}.orig.tar.xz"
ORIG_SHA256 = "f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe"
SOURCE_LINE = ("deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
               "http://deb.debian.org/debian trixie main")
#: bookworm's packages unpacked into the sysroot (headers, static archives, ``protoc-c`` and the
#: shared libraries it runs with, ``descriptor.proto`` for CRIU's images).
SYSROOT_PACKAGES = ("libprotobuf-c-dev", "protobuf-c-compiler", "libprotoc32", "libprotobuf32",
                    "libprotobuf-dev", "libnl-3-dev", "libnet1-dev", "libcap-dev")
#: Built without GnuTLS (page-server encryption) and without nftables (network locking of a dumped
#: network namespace): neither is used when a container's own processes are dumped.
MAKE_FLAGS = ("NO_GNUTLS=1",)
MULTIARCH = "x86_64-linux-gnu"
STAMP = ".built"


def criu_dir() -> Path:
    """The cache entry: ``bin/criu`` and a stamp naming the tarball's digest."""
    return cache_dir() / f"criu-{VERSION}"


def criu_binary() -> Path:
    return criu_dir() / "bin" / "criu"


def find_criu() -> Path | None:
    """The built CRIU, or ``None`` when the cache has none (or an unfinished one)."""
    stamp = criu_dir() / STAMP
    try:
        finished = stamp.read_text().strip() == ORIG_SHA256
    except OSError:
        return None
    binary = criu_binary()
    return binary if finished and binary.is_file() else None


def criu_impossible_reason() -> str | None:
    """Why CRIU can be neither found nor built here; ``None`` when it can."""
    if find_criu() is not None:
        return None
    for program in ("apt-get", "dpkg", "make", "gcc"):
        if shutil.which(program) is None:
            return f"{program} is missing: CRIU is built from Debian's source with it"
    if not STATIC_LIBC.is_file():
        return f"{STATIC_LIBC} is missing (libc6-dev): CRIU is linked statically"
    return None


def ensure_criu(log: Log = quiet) -> Path:
    """The static CRIU binary, built first when the cache has none (about a minute, downloads
    included). Raises :class:`BuildImpossibleError` when it cannot be built here (no apt-get, no
    compiler, no route to Debian) and :class:`BuildFailedError` when the build fails; both name the
    step and its log."""
    return ensure_built(find_criu, lambda logs: _build(log), what=f"CRIU {VERSION}", lock_name=".criu-build.lock",
                        problem=criu_impossible_reason, lock=exclusive_lock, log=log)


def _build(log: Log) -> None:
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    target = criu_dir()
    shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="criu-build-", dir=cache_dir()) as scratch:
        work = Path(scratch)
        log(f"fetching CRIU {VERSION}'s source and bookworm's libraries with apt (logs: {logs}/criu-*.log)")
        tarball = _fetch_source(work, logs)
        sysroot = _sysroot(work, logs)
        source = _unpack(tarball, work)
        log(f"building CRIU {VERSION} (make criu, static; log: {logs / 'criu-make.log'})")
        _make(source, sysroot, logs)
        built = source / "criu" / "criu"
        if not is_static_elf(built):
            raise BuildFailedError(f"{built} is not statically linked; see {logs / 'criu-make.log'}")
        (target / "bin").mkdir(parents=True)
        shutil.copy2(built, target / "bin" / "criu")
        (target / STAMP).write_text(ORIG_SHA256 + "\n")


def _private_apt(work: Path) -> list[str]:
    """apt options for a configuration of our own: the machine's lists and sources are untouched."""
    etc, lists, cache = work / "apt" / "etc", work / "apt" / "lists", work / "apt" / "cache"
    for path in (etc, lists / "partial", cache / "archives" / "partial"):
        path.mkdir(parents=True, exist_ok=True)
    (etc / "sources.list").write_text(SOURCE_LINE + "\n")
    return ["-o", f"Dir::Etc::SourceList={etc / 'sources.list'}",
            "-o", f"Dir::Etc::SourceParts={etc / 'sources.list.d'}",
            "-o", f"Dir::State::Lists={lists}", "-o", f"Dir::Cache={cache}"]


def _fetch_source(work: Path, logs: Path) -> Path:
    options = _private_apt(work)
    run_step(["apt-get", *options, "update"], logs / "criu-apt-update.log", failure=BuildImpossibleError,
             step="apt-get update (trixie's sources, private lists)")
    downloads = work / "source"
    downloads.mkdir()
    run_step(["apt-get", *options, "source", "--download-only", "--tar-only", f"criu={DEBIAN_VERSION}"],
             logs / "criu-apt-source.log", failure=BuildImpossibleError, step="apt-get source criu",
             cwd=downloads)
    tarball = downloads / ORIG_TARBALL
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest() if tarball.is_file() else "nothing"
    if digest != ORIG_SHA256:
        raise BuildFailedError(f"{ORIG_TARBALL}: SHA-256 {digest}, expected {ORIG_SHA256}")
    return tarball


def _sysroot(work: Path, logs: Path) -> Path:
    debs, sysroot = work / "debs", work / "sysroot"
    debs.mkdir()
    run_step(["apt-get", "download", *SYSROOT_PACKAGES], logs / "criu-apt-download.log",
             failure=BuildImpossibleError, step="apt-get download (CRIU's libraries)", cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        run_step(["dpkg", "-x", str(deb), str(sysroot)], logs / "criu-dpkg-x.log", failure=BuildFailedError,
                 step=f"dpkg -x {deb.name}")
    return sysroot


def _unpack(tarball: Path, work: Path) -> Path:
    with tarfile.open(tarball) as archive:
        archive.extractall(work, filter="tar")  # pinned by digest; one absolute link (descriptor.proto), replaced below
    found = [p for p in work.iterdir() if p.is_dir() and p.name.startswith("criu-")]
    if len(found) != 1:
        raise BuildFailedError(f"{tarball.name} did not unpack into one criu-* directory")
    return found[0]


def _make(source: Path, sysroot: Path, logs: Path) -> None:
    lib = sysroot / "usr" / "lib" / MULTIARCH
    include = sysroot / "usr" / "include"
    # CRIU's images import google/protobuf/descriptor.proto from the source tree.
    proto = source / "images" / "google" / "protobuf" / "descriptor.proto"
    proto.unlink(missing_ok=True)
    proto.symlink_to(include / "google" / "protobuf" / "descriptor.proto")
    env = {**os.environ,
           "PATH": f"{sysroot / 'usr' / 'bin'}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
           "LD_LIBRARY_PATH": str(lib),  # protoc-c's libprotoc and libprotobuf
           # through the environment: on make's line it would replace CRIU's own; libnl-3.a is in /lib
           "LDFLAGS": f"-static -L{lib} -L{sysroot / 'lib' / MULTIARCH}",
           "USERCFLAGS": f"-I{include} -I{include / 'libnl3'}",
           "PKG_CONFIG_LIBDIR": str(lib / "pkgconfig"),
           "PKG_CONFIG_SYSROOT_DIR": str(sysroot)}
    jobs = str(max(1, min(4, os.cpu_count() or 1)))
    run_step(["make", f"-j{jobs}", *MAKE_FLAGS, "criu"], logs / "criu-make.log", failure=BuildFailedError,
             step=f"make criu ({VERSION})", cwd=source, env=env)


def criu_version(binary: Path) -> str:
    """What ``criu --version`` says (its first line), for test output."""
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    return (done.stdout or done.stderr).splitlines()[0] if (done.stdout or done.stderr) else "?"
