"""Build a current Kubernetes (control plane, kubelet, kubectl), etcd and the fake CRI runtime from
their published Go modules, once per version.

Why build at all: the project depends on nothing installed on the machine image (a ``kubectl`` found
on ``$PATH`` is not used). Kubernetes publishes ``k8s.io/kubernetes`` as a module at every release
tag, but its ``go.mod`` points the staging modules (``k8s.io/api``, ``k8s.io/apiserver``, ...) at
``./staging/...``, which the module does not contain. So a wrapper module requires
``k8s.io/kubernetes vX.Y.Z`` and replaces each staging module by its published ``v0.Y.Z``
(:func:`kubernetes_go_mod`), as every out-of-tree build of Kubernetes components does; the release
is pinned in :mod:`gpupool.testenv.versions`.

The results are cached outside the repository (:mod:`gpupool.testenv.paths`); a cache hit checks a
handful of files and returns, so every caller may call :func:`ensure_binaries` freely; an exclusive
file lock makes parallel callers (two pytest sessions, CLI and pytest) build only once.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from gpupool.testenv.errors import BuildFailedError
from gpupool.testenv.gobuild import (
    GoBuild,
    GoProgram,
    build,
    ensure_built,
    go_env,
    module_dir,
    toolchain_problem,
    wrapper_go_mod,
)
from gpupool.testenv.paths import FAKECRI_COMMAND, K8S_COMMANDS, Binaries, cache_dir
from gpupool.testenv.steps import Log, exclusive_lock, quiet
from gpupool.testenv.versions import ETCD, Release, release

__all__ = ["Log", "build_impossible_reason", "cached_binaries", "ensure_binaries", "fakecri_source",
           "kubernetes_go_mod", "kubernetes_source"]

#: The lock file (in the cache) that serialises builds of a release, etcd and the fake runtime.
BUILD_LOCK = ".build.lock"

#: The module of the Kubernetes release.
KUBERNETES_MODULE = "k8s.io/kubernetes"

#: etcd's server module; its root package is the ``etcd`` binary.
ETCD_MODULE = "go.etcd.io/etcd/server/v3"

#: A ``require`` line of a staging module in Kubernetes' own ``go.mod`` (``k8s.io/api v0.0.0``).
_STAGING_REQUIRE = re.compile(r"^\s*(k8s\.io/[\w.-]+) v0\.0\.0\s*$", re.MULTILINE)
_GODEBUG = re.compile(r"^godebug\s+(.+)$", re.MULTILINE)
_GO_DIRECTIVE = re.compile(r"^go\s+(\S+)\s*$", re.MULTILINE)


def fakecri_source() -> Path:
    """The Go source of the project's fake CRI runtime main (shipped as package data)."""
    return Path(__file__).resolve().parent / "fakecri" / "main.go"


def kubernetes_go_mod(kubernetes_mod: str, rel: Release) -> str:
    """The wrapper ``go.mod`` for ``rel`` from Kubernetes' own ``go.mod`` text: its ``go`` and
    ``godebug`` lines (Kubernetes relies on them), and every staging module it requires at
    ``v0.0.0`` replaced by the published ``v0.Y.Z``."""
    staging = sorted(set(_STAGING_REQUIRE.findall(kubernetes_mod)))
    if not staging:
        raise BuildFailedError(f"{KUBERNETES_MODULE} {rel.kubernetes}: its go.mod requires no staging module at v0.0.0")
    go_match = _GO_DIRECTIVE.search(kubernetes_mod)
    return wrapper_go_mod([(KUBERNETES_MODULE, rel.kubernetes)],
                          replaces=[(m, m, rel.staging) for m in staging],
                          go=go_match.group(1) if go_match else "1.26.0",
                          godebug=[d.strip() for d in _GODEBUG.findall(kubernetes_mod)])


def _version_ldflags(rel: Release) -> str:
    """Stamp the release into the binaries (kubelet reports it on the Node, kubectl and the
    apiserver's /version answer it), as the upstream Makefile does from git."""
    major, minor = rel.minor.split(".")
    stamps = {"gitVersion": rel.kubernetes, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean"}
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.{key}={value}" for key, value in stamps.items()]
    return " ".join(flags)


def _cached_mod_file(module: str, version: str) -> Path:
    """Where the module cache keeps ``module@version``'s ``go.mod`` once downloaded."""
    return Path(go_env()["GOMODCACHE"]) / "cache" / "download" / module / "@v" / f"{version}.mod"


def _kubernetes_specs(rel: Release, kubernetes_mod: str) -> tuple[GoBuild, GoBuild]:
    """The Kubernetes programs, and the fake runtime compiled against the same modules."""
    go_mod = kubernetes_go_mod(kubernetes_mod, rel)
    programs = tuple(GoProgram(c, f"{KUBERNETES_MODULE}/cmd/{c}") for c in K8S_COMMANDS)
    kubernetes = GoBuild(key=f"kubernetes-{rel.kubernetes}", go_mod=go_mod, programs=programs,
                         ldflags=_version_ldflags(rel))
    source = fakecri_source().read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    fakecri = GoBuild(key=f"fakecri-{rel.kubernetes}-{digest}", go_mod=go_mod,
                      programs=(GoProgram(FAKECRI_COMMAND, f"gpupool.local/testenv/cmd/{FAKECRI_COMMAND}"),),
                      sources={f"cmd/{FAKECRI_COMMAND}/main.go": source})
    return kubernetes, fakecri


def _etcd_spec() -> GoBuild:
    return GoBuild(key=f"etcd-{ETCD}", go_mod=wrapper_go_mod([(ETCD_MODULE, ETCD)]),
                   programs=(GoProgram("etcd", ETCD_MODULE),))


def _binaries(rel: Release, kubernetes: GoBuild, fakecri: GoBuild, etcd: GoBuild) -> Binaries:
    k8s = kubernetes.paths()
    return Binaries(kube_apiserver=k8s["kube-apiserver"], kube_scheduler=k8s["kube-scheduler"],
                    kubelet=k8s["kubelet"], kube_controller_manager=k8s["kube-controller-manager"],
                    kubectl=k8s["kubectl"], fakecri=fakecri.paths()[FAKECRI_COMMAND],
                    etcd=etcd.paths()["etcd"], version=rel.kubernetes)


def cached_binaries(version: str | None = None) -> Binaries | None:
    """The binaries of the release ``version`` names (default: the newest) if every cache entry is
    complete, else ``None``. The fast path: a few ``stat`` calls and small reads, no subprocess."""
    rel = release(version)
    mod_file = _cached_mod_file(KUBERNETES_MODULE, rel.kubernetes)
    try:
        kubernetes_mod = mod_file.read_text()
    except OSError:
        return None
    kubernetes, fakecri = _kubernetes_specs(rel, kubernetes_mod)
    etcd = _etcd_spec()
    if not (kubernetes.is_built() and fakecri.is_built() and etcd.is_built()):
        return None
    return _binaries(rel, kubernetes, fakecri, etcd)


def build_impossible_reason(version: str | None = None) -> str | None:
    """Why this machine can never build the binaries (no Go, or one too old), or ``None``.

    A missing network shows up later, when a download fails (also :class:`BuildImpossibleError`).
    """
    if cached_binaries(version) is not None:
        return None
    return toolchain_problem()


def ensure_binaries(log: Log = quiet, version: str | None = None) -> Binaries:
    """The binaries of the release ``version`` names (default: ``$GPUPOOL_TESTENV_K8S_VERSION`` or
    the newest pinned), built first if the cache lacks them.

    Raises :class:`BuildImpossibleError` when the machine cannot build (no Go, no route to the
    module proxy), :class:`BuildFailedError` when a build step fails (the message names its log),
    and ``ValueError`` for a version that is not pinned.
    """
    rel = release(version)

    def make(logs: Path) -> None:
        source = kubernetes_source(rel, log=log)
        kubernetes, fakecri = _kubernetes_specs(rel, (source / "go.mod").read_text())
        for spec in (_etcd_spec(), kubernetes, fakecri):
            build(spec, logs=logs, log=log)

    binaries = ensure_built(lambda: cached_binaries(version), make, what=f"Kubernetes {rel.kubernetes}",
                            lock_name=BUILD_LOCK, problem=toolchain_problem, lock=exclusive_lock, log=log)
    log(f"Kubernetes {rel.kubernetes} binaries ready")
    return binaries


def kubernetes_source(rel: Release | None = None, *, log: Log = quiet) -> Path:
    """The read-only source of the Kubernetes release (downloaded into the module cache once): its
    ``go.mod``, and files other builds use (``build/pause/linux/pause.c``)."""
    rel = rel or release()
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cached = Path(go_env()["GOMODCACHE"]) / f"{KUBERNETES_MODULE}@{rel.kubernetes}"
    if (cached / "go.mod").is_file() and _cached_mod_file(KUBERNETES_MODULE, rel.kubernetes).is_file():
        return cached
    return module_dir(KUBERNETES_MODULE, rel.kubernetes, logs=logs, log=log)
