"""Build Go programs from published, pinned Go modules into the test environment's cache.

Every program the test environment runs (kube-apiserver, kubelet, etcd, containerd, runc, KWOK,
the fake CRI runtime) is built here the same way: a small *wrapper module* is generated under the
cache (``go.mod`` requiring the pinned module, plus any ``replace`` lines it needs, plus the
project's own Go sources for programs like the fake runtime), then ``go build`` compiles each
program into a private directory that becomes the cache entry only once every program of the set
is built (``rename`` of the directory, then a stamp). A build that fails half-way leaves no entry,
so nothing half-built is ever used; the message names the step and its log.

The Go toolchain is the machine's (Go 1.26: ``$PATH`` or ``/usr/local/go/bin``), never downloaded
(``GOTOOLCHAIN=local``); the module and build caches live under the project's cache directory, so
a warm machine rebuilds nothing and a cleaned one needs only the module proxy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpupool.testenv.errors import BuildFailedError, BuildImpossibleError
from gpupool.testenv.paths import cache_dir
from gpupool.testenv.steps import Log, exclusive_lock, quiet, run_step

T = TypeVar("T")

#: The oldest Go that builds every pinned module (Kubernetes 1.37's ``go.mod`` says ``go 1.26.0``).
GO_MINIMUM = (1, 26)

#: Where Go is installed on this project's machines when it is not on ``$PATH``.
GO_FALLBACK = Path("/usr/local/go/bin/go")

#: The file in a finished entry that names what was built (the entry is complete iff it exists and
#: matches the spec's digest).
STAMP = ".complete"


@dataclass(frozen=True)
class GoProgram:
    """One ``main`` package and the file name its binary gets."""

    name: str
    package: str


@dataclass(frozen=True)
class GoBuild:
    """A set of programs built from one wrapper module, cached as one entry named ``key``."""

    key: str
    go_mod: str
    programs: tuple[GoProgram, ...]
    ldflags: str = "-s -w"
    tags: tuple[str, ...] = ()
    cgo: bool = False
    sources: Mapping[str, bytes] = field(default_factory=dict)
    """Extra files of the wrapper module (relative path → content), e.g. a ``main.go``."""

    def digest(self) -> str:
        """What the entry's stamp records: any change of module, programs or flags rebuilds."""
        spec = {"go_mod": self.go_mod, "programs": [[p.name, p.package] for p in self.programs],
                "ldflags": self.ldflags, "tags": list(self.tags), "cgo": self.cgo,
                "sources": {k: hashlib.sha256(v).hexdigest() for k, v in sorted(self.sources.items())}}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()

    def bin_dir(self) -> Path:
        """Where the finished entry's binaries live."""
        return cache_dir() / self.key / "bin"

    def paths(self) -> dict[str, Path]:
        """Program name → its binary in the finished entry."""
        return {p.name: self.bin_dir() / p.name for p in self.programs}

    def is_built(self) -> bool:
        """Whether the entry is complete for exactly this spec (a few ``stat`` calls and one read)."""
        stamp = self.bin_dir() / STAMP
        try:
            if stamp.read_text().strip() != self.digest():
                return False
        except OSError:
            return False
        return all(path.is_file() and os.access(path, os.X_OK) for path in self.paths().values())


def go_binary() -> Path | None:
    """The machine's ``go``, if any."""
    found = shutil.which("go")
    if found:
        return Path(found)
    return GO_FALLBACK if GO_FALLBACK.is_file() else None


def go_version(go: Path) -> tuple[int, int] | None:
    """``(major, minor)`` of ``go version``'s answer, or ``None`` if it cannot be read."""
    try:
        out = subprocess.run([str(go), "version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"go(\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


def toolchain_problem() -> str | None:
    """Why Go programs cannot be built here (no Go, or one too old), or ``None``."""
    go = go_binary()
    if go is None:
        return (f"Go not found (neither on $PATH nor at {GO_FALLBACK}): the test environment builds "
                f"Kubernetes from its Go modules and needs Go {GO_MINIMUM[0]}.{GO_MINIMUM[1]} or newer")
    version = go_version(go)
    if version is None or version < GO_MINIMUM:
        found = "an unreadable version" if version is None else f"go{version[0]}.{version[1]}"
        return f"{go} is {found}; the pinned modules need Go {GO_MINIMUM[0]}.{GO_MINIMUM[1]} or newer"
    return None


def go_env(*, cgo: bool = False) -> dict[str, str]:
    """The environment of every ``go`` command: the project's caches, the machine's toolchain only."""
    # Resolved: Go keys its build cache by source paths, so the same cache reached through a link
    # must name the same directories to be a hit.
    root = (cache_dir() / "go").resolve()
    go = go_binary()
    path = os.environ.get("PATH", "")
    if go is not None and str(go.parent) not in path.split(os.pathsep):
        path = f"{go.parent}{os.pathsep}{path}"
    return {
        **os.environ,
        "PATH": path,
        "GOMODCACHE": str(root / "mod"),
        "GOCACHE": str(root / "build"),
        "GOPATH": str(root / "path"),
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-trimpath -mod=mod -buildvcs=false",
        "CGO_ENABLED": "1" if cgo else "0",
    }


#: What ``go mod download`` says when the proxy cannot be reached (as opposed to a version it does
#: not serve, which is a wrong pin and a build failure).
_UNREACHABLE = re.compile(r"dial tcp|no such host|i/o timeout|connection refused|TLS handshake timeout|"
                          r"network is unreachable|temporary failure in name resolution", re.IGNORECASE)


def module_dir(module: str, version: str, *, logs: Path, log: Log = quiet) -> Path:
    """Download ``module@version`` into the module cache (once) and return its directory.

    Raises :class:`BuildImpossibleError` when the module proxy cannot be reached (this machine
    cannot build at all), :class:`BuildFailedError` when it answers but does not serve that version
    (a wrong pin); both name the step and its log.
    """
    _require_toolchain()
    safe = re.sub(r"[^A-Za-z0-9.-]+", "_", f"{module}@{version}")
    log_path = logs / f"download-{safe}.log"
    out = logs / f"download-{safe}.json"
    log(f"downloading {module}@{version} (log: {log_path})")
    step = f"go mod download {module}@{version}"
    try:
        run_step([str(go_binary()), "mod", "download", "-json", f"{module}@{version}"], log_path,
                 failure=BuildFailedError, step=step, env=go_env(), cwd=logs)
    except BuildFailedError as exc:
        text = log_path.read_text(errors="replace") if log_path.is_file() else ""
        if _UNREACHABLE.search(text):
            raise BuildImpossibleError(f"{step}: the Go module proxy cannot be reached; {exc}") from exc
        raise BuildFailedError(f"{step}: the module proxy does not serve this version (a wrong pin?); {exc}") from exc
    text = log_path.read_text()
    out.write_text(text)
    start = text.find("{")
    try:
        info = json.loads(text[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        info = {}
    directory = info.get("Dir")
    if not directory or not Path(directory).is_dir():
        raise BuildImpossibleError(f"go mod download {module}@{version} gave no source directory; log: {log_path}")
    return Path(directory)


def ensure_built(find: Callable[[], T | None], make: Callable[[Path], None], *, what: str, lock_name: str,
                 problem: Callable[[], str | None] = toolchain_problem,
                 lock: Callable[[Path, Log], AbstractContextManager[None]] = exclusive_lock,
                 log: Log = quiet) -> T:
    """What ``find`` returns, after ``make(logs)`` builds it if the cache lacks it: the one path every
    cached build of the test environment takes.

    A hit costs ``find`` alone (no lock, no subprocess). On a miss ``problem`` says whether the
    machine can build at all (:class:`BuildImpossibleError` with its reason if not); then the build
    runs under the cache's lock ``lock_name``, rechecking first because another process may have
    built it while this one waited. A build that ends without what ``find`` looks for is a
    :class:`BuildFailedError` naming ``what``. Callers pass their module's ``problem`` and ``lock``
    so that each stays replaceable where it is used.
    """
    found = find()
    if found is not None:
        return found
    reason = problem()
    if reason is not None:
        raise BuildImpossibleError(reason)
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with lock(cache_dir() / lock_name, log):
        if find() is None:
            make(logs)
    found = find()
    if found is None:
        raise BuildFailedError(f"{what}: the build finished but its cache entry is incomplete")
    return found


def build(spec: GoBuild, *, logs: Path, log: Log = quiet, parallel: int = 2) -> dict[str, Path]:
    """Build ``spec`` unless its entry is complete; return program name → binary.

    The caller holds the build lock. Each program is compiled into ``<key>/bin.partial`` (one
    ``go build`` each, sharing the Go build cache), and the directory is renamed to ``<key>/bin``
    with its stamp only when all succeeded.
    """
    if spec.is_built():
        return spec.paths()
    _require_toolchain()
    entry = cache_dir() / spec.key
    wrapper = entry / "module"
    shutil.rmtree(wrapper, ignore_errors=True)
    wrapper.mkdir(parents=True)
    (wrapper / "go.mod").write_text(spec.go_mod)
    for relative, content in spec.sources.items():
        target = wrapper / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    partial = entry / "bin.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    env = go_env(cgo=spec.cgo)
    for batch in _batches(spec.programs):
        names = " ".join(p.name for p in batch)
        log_path = logs / f"build-{spec.key}-{batch[0].name if len(batch) == 1 else 'all'}.log"
        log(f"compiling {names} ({spec.key}; cold builds take minutes; log: {log_path})")
        command: list[str] = [str(go_binary()), "build", f"-p={parallel}", f"-ldflags={spec.ldflags}"]
        if spec.tags:
            command.append(f"-tags={','.join(spec.tags)}")
        # One command for several programs: go links one while it compiles the next, so both cores
        # stay busy (a link alone uses about one). With several packages, -o names a directory.
        output = str(partial / batch[0].name) if len(batch) == 1 else f"{partial}/"
        command += ["-o", output, *(p.package for p in batch)]
        run_step(command, log_path, failure=BuildFailedError, step=f"go build {names} ({spec.key})",
                 cwd=wrapper, env=env)
    (partial / STAMP).write_text(spec.digest() + "\n")
    final = entry / "bin"
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return spec.paths()


def _batches(programs: Sequence[GoProgram]) -> list[tuple[GoProgram, ...]]:
    """The programs ``go build`` can write into one directory in one command (those whose name is
    their package's last element, as go names them), then each other program alone."""
    together = tuple(p for p in programs if p.name == p.package.rsplit("/", 1)[-1])
    batches: list[tuple[GoProgram, ...]] = [together] if len(together) > 1 else [(p,) for p in together]
    return batches + [(p,) for p in programs if p not in together]


def _require_toolchain() -> None:
    problem = toolchain_problem()
    if problem is not None:
        raise BuildImpossibleError(problem)


def wrapper_go_mod(requires: Sequence[tuple[str, str]], *, replaces: Sequence[tuple[str, str, str]] = (),
                   go: str = "1.26.0", godebug: Sequence[str] = ()) -> str:
    """The text of a wrapper ``go.mod``: ``requires`` are (module, version), ``replaces`` are
    (module, replacement module, version)."""
    lines = ["module gpupool.local/testenv", "", f"go {go}", ""]
    lines += [f"godebug {d}" for d in godebug]
    lines += ["", "require ("]
    lines += [f"\t{module} {version}" for module, version in requires]
    lines.append(")")
    if replaces:
        lines += ["", "replace ("]
        lines += [f"\t{module} => {target} {version}" for module, target, version in replaces]
        lines.append(")")
    return "\n".join(lines) + "\n"
