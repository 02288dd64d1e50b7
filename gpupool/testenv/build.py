"""Build kube-apiserver, kube-scheduler, kubelet and the fake CRI runtime, offline, once.

Why build at all: Debian ships no kube-apiserver package, but its ``kubernetes`` *source* package
(``1.20.5+really1.20.2``) is the complete upstream v1.20.2 tree with ``vendor/``. Building it needs
only Debian's registry (no GitHub, no Go module proxy), so CI machines that can reach nothing else
can still run a real control plane.

The result is cached outside the repository (see :mod:`gpupool.testenv.paths`). A cache hit checks
a handful of files and returns, so every caller may call :func:`ensure_binaries` freely; an
exclusive file lock makes parallel callers (two pytest sessions, CLI and pytest) build only once.

The system's apt configuration is never touched: the ``deb-src`` line lives in a private sources
list, with private list and cache directories, all under the cache root.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from gpupool.testenv.errors import BuildFailedError, BuildImpossibleError
from gpupool.testenv.paths import (
    FAKECRI_COMMAND,
    K8S_COMMANDS,
    K8S_VERSION,
    Binaries,
    bin_dir,
    cache_dir,
)

#: Debian packages that provide the Go toolchain, etcd and rsync (the Kubernetes Makefile uses it),
#: and the source of reflect2 1.0.2 (see :data:`REFLECT2_SOURCE`).
APT_PACKAGES = ("golang-go", "etcd-server", "rsync", "golang-github-modern-go-reflect2-dev")

#: reflect2 1.0.2, which replaces the tree's vendored 1.0.1. Built with Go 1.18 or later (Debian
#: bookworm has 1.19), reflect2 1.0.1 makes kube-apiserver crash with "unexpected fault address"
#: the first time it encodes a map through json-iterator, which it does for every custom resource
#: it stores (modern-go/reflect2#23); 1.0.2 is the upstream fix, with the same API.
REFLECT2_SOURCE = Path("/usr/share/gocode/src/github.com/modern-go/reflect2")

#: The binaries built from a patched tree, and the name of the patch: a binary built before the
#: patch (no stamp ``.<binary>.<patch>`` beside it) is built again.
PATCHED = {"kube-apiserver": "reflect2-1.0.2"}

#: Debian release whose ``kubernetes`` source package is ``1.20.5+really1.20.2`` (pinned: source
#: packages build anywhere, and a newer release may carry another Kubernetes or none at all).
DEBIAN_SUITE = "bookworm"

#: The commit of upstream v1.20.2, stamped into the binaries' version info.
K8S_GIT_COMMIT = "faecb196815e248d3ecfb03c680a4507229c2a56"

#: How many hex digits of the source's SHA-256 name a fake-runtime binary (64 bits: no collisions).
FAKECRI_KEY_LENGTH = 16

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    """Default progress sink: say nothing."""


def fakecri_source() -> Path:
    """The Go source of the project's fake CRI runtime main (shipped as package data)."""
    return Path(__file__).resolve().parent / "fakecri" / "main.go"


def fakecri_digest() -> str:
    """SHA-256 of the fake CRI source; a changed source invalidates only that one binary."""
    return hashlib.sha256(fakecri_source().read_bytes()).hexdigest()


def fakecri_binary() -> Path:
    """Where the fake runtime built from *this* source lives: ``bin/gpupool-fakecri-<hash>``.

    Keyed by the source's hash, not stamped: checkouts with different ``main.go`` (branches, other
    engineers' worktrees sharing the cache) each find their own binary, a rebuild never replaces a
    binary another run is executing, and no two checkouts rebuild over each other in turn.
    """
    return bin_dir() / f"{FAKECRI_COMMAND}-{fakecri_digest()[:FAKECRI_KEY_LENGTH]}"


def system_etcd() -> Path | None:
    """The etcd binary installed by ``etcd-server``, if present."""
    found = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    return Path(found) if found else None


def cached_binaries() -> Binaries | None:
    """The binaries if the cache is complete and the fake CRI matches its source, else ``None``.

    This is the fast path: a few ``stat`` calls and one small hash, no locks, no subprocesses.
    """
    etcd = system_etcd()
    if etcd is None:
        return None
    binaries = Binaries.in_dir(bin_dir(), etcd, fakecri_binary())
    if binaries.missing() or any(not _stamp(c).is_file() for c in PATCHED):
        return None
    return binaries


def _stamp(command: str) -> Path:
    """The file saying that ``command`` was built from the tree with its patch applied."""
    return bin_dir() / f".{command}.{PATCHED[command]}"


def build_impossible_reason() -> str | None:
    """Why this machine can never build the binaries, or ``None`` if it might.

    Only facts that no retry can change count (no apt, not root when packages are missing);
    a missing network shows up later, when ``apt-get update`` fails.
    """
    if cached_binaries() is not None:
        return None
    if shutil.which("apt-get") is None or shutil.which("dpkg-source") is None:
        return "apt-get/dpkg-source not found: the test environment is built from Debian's source package"
    missing_tools = [t for t in ("go", "etcd", "rsync", "make") if shutil.which(t) is None]
    if missing_tools and os.geteuid() != 0:
        return f"{', '.join(missing_tools)} missing and not running as root, so cannot apt-get install them"
    return None


def ensure_binaries(log: Log = _quiet) -> Binaries:
    """Return the test environment's binaries, building them first if the cache lacks them.

    Raises :class:`BuildImpossibleError` when the machine cannot build (no apt, not root, no route
    to Debian's registry) and :class:`BuildFailedError` when a build step fails.
    """
    hit = cached_binaries()
    if hit is not None:
        return hit
    reason = build_impossible_reason()
    if reason is not None:
        raise BuildImpossibleError(reason)
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(root / ".build.lock", log):
        hit = cached_binaries()  # another process may have built while we waited
        if hit is not None:
            return hit
        return _build(root, log)


@contextmanager
def _exclusive_lock(path: Path, log: Log) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path``; the kernel releases it if the holder dies."""
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another process is building the test environment; waiting for {path}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


#: Public names of the build's steps, for the other builds of the test environment
#: (:mod:`gpupool.testenv.scheduler_patch`).
exclusive_lock = _exclusive_lock
quiet = _quiet


def _build(root: Path, log: Log) -> Binaries:
    """Run every build step that the cache does not already have done."""
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    _install_packages(logs, log)
    tree = _source_tree(root, logs, log)
    out = bin_dir()
    out.mkdir(parents=True, exist_ok=True)
    etcd = system_etcd()
    if etcd is None:
        raise BuildFailedError("etcd not found after installing etcd-server")
    targets = [f"cmd/{c}" for c in K8S_COMMANDS
               if not (out / c).is_file() or (c in PATCHED and not _stamp(c).is_file())]
    if targets:
        _patch_vendor(tree)
        log(f"compiling {' '.join(targets)} (cold: several minutes; log: {logs / 'make.log'})")
        _run(
            ["make", f"WHAT={' '.join(targets)}"],
            logs / "make.log",
            cwd=tree,
            env=_go_env(tree),
            failure=BuildFailedError,
            step="make",
        )
        built = tree / "_output" / "bin"
        for target in targets:
            command = target.removeprefix("cmd/")
            _install(built / command, out / command)
            if command in PATCHED:
                _stamp(command).touch()
        # The Go build cache is 1.5 GB; the fake runtime keeps its own, smaller one.
        shutil.rmtree(tree / "_output" / "local" / "go" / "cache", ignore_errors=True)
    fakecri = fakecri_binary()
    if not fakecri.is_file():
        _build_fakecri(root, tree, fakecri, logs, log)
    binaries = Binaries.in_dir(out, etcd, fakecri)
    if binaries.missing():
        raise BuildFailedError(f"build finished but these are missing: {binaries.missing()}")
    log(f"test environment binaries ready in {out}")
    return binaries


def _build_fakecri(root: Path, tree: Path, target: Path, logs: Path, log: Log) -> None:
    """Compile this checkout's fake runtime into ``target`` with ``go build`` (no ``make``: it needs
    no generated files) and a Go build cache of its own, kept so that the next change of
    ``main.go`` recompiles one small package in seconds instead of its dependencies for a minute.

    The source goes to a directory named by its hash, so a build for another checkout (same lock,
    same tree) never compiles this one's ``main.go`` by mistake.
    """
    key = target.name.removeprefix(f"{FAKECRI_COMMAND}-")
    package = tree / "cmd" / f"{FAKECRI_COMMAND}-{key}"
    package.mkdir(exist_ok=True)
    shutil.copyfile(fakecri_source(), package / "main.go")
    tmp = target.with_name(f".{target.name}.tmp")
    log(f"compiling the fake container runtime {target.name} (log: {logs / 'fakecri.log'})")
    # Kubernetes 1.20 builds in GOPATH mode (hack/lib/init.sh: GO111MODULE=off), from the tree
    # linked into _output/local/go as k8s.io/kubernetes, so vendor/ resolves the imports.
    gopath = tree / "_output" / "local" / "go"
    linked = gopath / "src" / "k8s.io" / "kubernetes"
    if not linked.exists():
        linked.parent.mkdir(parents=True, exist_ok=True)
        linked.symlink_to(tree)
    # PWD: Go takes the working directory from it when it names the same directory, and only the
    # path through GOPATH lets vendor/ resolve (the real path lies outside GOPATH).
    env = {**os.environ, "GO111MODULE": "off", "GOFLAGS": "", "GOPROXY": "off", "CGO_ENABLED": "0",
           "GOPATH": str(gopath), "GOCACHE": str(root / "go-cache-fakecri"), "PWD": str(linked)}
    try:
        _run(["go", "build", "-ldflags=-s -w", "-o", str(tmp), f"./cmd/{package.name}"], logs / "fakecri.log",
             cwd=linked, env=env, failure=BuildFailedError, step="go build (fake runtime)")
    finally:
        shutil.rmtree(package, ignore_errors=True)
    _install(tmp, target)
    tmp.unlink()


def _patch_vendor(tree: Path) -> None:
    """Put reflect2 1.0.2 in place of the tree's vendored 1.0.1 (see :data:`REFLECT2_SOURCE`)."""
    if not REFLECT2_SOURCE.is_dir():
        raise BuildFailedError(f"{REFLECT2_SOURCE} missing: apt-get install golang-github-modern-go-reflect2-dev")
    vendored = tree / "vendor" / "github.com" / "modern-go" / "reflect2"
    for old in vendored.glob("*.go"):
        old.unlink()
    for new in REFLECT2_SOURCE.glob("*.go"):
        if not new.name.endswith("_test.go"):
            shutil.copyfile(new, vendored / new.name)


def _install(built: Path, target: Path) -> None:
    """Copy a built binary into place atomically: a reader sees the old file or the whole new one,
    and a process already running the old file keeps it (``rename`` replaces the name only)."""
    tmp = target.with_name(f".{target.name}.copy")
    shutil.copyfile(built, tmp)
    tmp.chmod(0o755)
    tmp.replace(target)


def _install_packages(logs: Path, log: Log) -> None:
    """``apt-get install`` Go, etcd and rsync when any is missing (needs root; CI runs as root)."""
    if all(shutil.which(t) for t in ("go", "etcd", "rsync", "make")) and REFLECT2_SOURCE.is_dir():
        return
    log(f"installing {' '.join(APT_PACKAGES)} make with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", *APT_PACKAGES, "make"]
    try:
        _run(cmd, logs / "apt-install.log", env=env, failure=BuildImpossibleError, step="apt-get install")
    except BuildImpossibleError:
        # Stale or absent package lists (fresh containers ship none): refresh and retry once.
        _run(["apt-get", "update"], logs / "apt-update-system.log", env=env,
             failure=BuildImpossibleError, step="apt-get update")
        _run(cmd, logs / "apt-install.log", env=env, failure=BuildImpossibleError, step="apt-get install")


def private_apt_options(apt_dir: Path) -> list[str]:
    """apt-get options that route every read and write to ``apt_dir`` instead of /etc and /var."""
    return [
        "-o", f"Dir::Etc::SourceList={apt_dir / 'sources.list'}",
        "-o", "Dir::Etc::SourceParts=/dev/null",
        "-o", f"Dir::State::Lists={apt_dir / 'lists'}",
        "-o", f"Dir::Cache={apt_dir / 'cache'}",
    ]


def source_tree(log: Log = _quiet) -> Path:
    """The unpacked Kubernetes tree in the cache (downloaded and unpacked first if it is missing),
    for the other things built from it (the pause image)."""
    root = cache_dir()
    tree = root / "src" / "kubernetes"
    if (tree / "Makefile").is_file() and (tree / "vendor").is_dir():
        return tree
    (root / "logs").mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(root / ".build.lock", log):
        return _source_tree(root, root / "logs", log)


def _source_tree(root: Path, logs: Path, log: Log) -> Path:
    """Download and unpack Debian's ``kubernetes`` source package (once) and return the tree."""
    tree = root / "src" / "kubernetes"
    if (tree / "Makefile").is_file() and (tree / "vendor").is_dir():
        return tree
    apt_dir = root / "apt"
    (apt_dir / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (apt_dir / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (apt_dir / "sources.list").write_text(
        f"deb-src http://deb.debian.org/debian {DEBIAN_SUITE} main\n"
    )
    options = private_apt_options(apt_dir)
    log("fetching Debian's kubernetes source package")
    _run(["apt-get", *options, "update"], logs / "apt-update.log",
         failure=BuildImpossibleError, step="apt-get update (private deb-src list)")
    download = root / "download"
    shutil.rmtree(download, ignore_errors=True)
    download.mkdir(parents=True)
    _run(["apt-get", *options, "source", "--download-only", "kubernetes"], logs / "apt-source.log",
         cwd=download, failure=BuildImpossibleError, step="apt-get source")
    dscs = sorted(download.glob("kubernetes_*.dsc"))
    if not dscs:
        raise BuildImpossibleError(f"apt-get source produced no .dsc in {download}")
    if "really1.20.2" not in dscs[-1].name:
        log(f"warning: expected kubernetes 1.20.5+really1.20.2, got {dscs[-1].name}")
    unpacked = root / "src" / "kubernetes.tmp"
    shutil.rmtree(unpacked, ignore_errors=True)
    unpacked.parent.mkdir(parents=True, exist_ok=True)
    _run(["dpkg-source", "-x", str(dscs[-1]), str(unpacked)], logs / "dpkg-source.log",
         failure=BuildFailedError, step="dpkg-source -x")
    _write_version_file(unpacked)
    shutil.rmtree(tree, ignore_errors=True)
    unpacked.rename(tree)
    shutil.rmtree(download, ignore_errors=True)  # 34 MB we no longer need
    return tree


def _write_version_file(tree: Path) -> None:
    """Give the binaries a real version (the tarball has no .git for the Makefile to ask)."""
    major, minor, _ = K8S_VERSION.removeprefix("v").split(".")
    (tree / ".gpupool-version").write_text(
        f"KUBE_GIT_VERSION='{K8S_VERSION}'\nKUBE_GIT_MAJOR='{major}'\nKUBE_GIT_MINOR='{minor}'\n"
        f"KUBE_GIT_COMMIT='{K8S_GIT_COMMIT}'\nKUBE_GIT_TREE_STATE='clean'\n"
    )


def _go_env(tree: Path) -> dict[str, str]:
    """The environment for an offline, static, vendored build."""
    return {
        **os.environ,
        "GOPROXY": "off",
        "CGO_ENABLED": "0",
        "GOFLAGS": "-mod=vendor",
        "KUBE_GIT_VERSION_FILE": str(tree / ".gpupool-version"),
    }


def _run(
    cmd: Sequence[str],
    log_path: Path,
    *,
    failure: type[Exception],
    step: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> None:
    """Run one build step with its output in ``log_path``; raise ``failure`` with the log's tail."""
    with log_path.open("w") as out:
        try:
            rc = subprocess.run(list(cmd), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, check=False).returncode
        except OSError as exc:
            raise failure(f"{step}: cannot run {cmd[0]}: {exc}") from exc
    if rc != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise failure(f"{step} failed (exit {rc}); full log: {log_path}\n{tail}")


run_step = _run
patch_vendor = _patch_vendor
go_env = _go_env
install = _install
