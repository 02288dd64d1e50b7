"""Helm, built from its pinned Go module, for the tests of ``charts/gpupool``.

The chart is linted, rendered and installed by a real ``helm`` (docs/helm.md), and no package
registry this project uses ships one (Debian 12 has none; PyPI's Helm packages wrap a binary
installed separately). Helm publishes its module (``helm.sh/helm/v4``) at every release tag with no
``replace`` lines, so a wrapper module requiring the pin (:data:`~gpupool.testenv.versions.HELM`)
builds ``cmd/helm`` exactly as released; the version is stamped in as Helm's Makefile does, so
``helm version`` names the pin. Under its own lock: it never waits behind a Kubernetes build.
"""

from __future__ import annotations

import re
from pathlib import Path

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
from gpupool.testenv.steps import Log, exclusive_lock, quiet
from gpupool.testenv.versions import HELM

__all__ = ["HELM_COMMAND", "HELM_MODULE", "cached_helm", "ensure_helm", "helm_build", "helm_go_mod"]

HELM_MODULE = "helm.sh/helm/v4"
HELM_COMMAND = "helm"

#: Helm's build takes its own lock, so it never waits behind a Kubernetes or runtime build.
BUILD_LOCK = ".helm-build.lock"

_GO_DIRECTIVE = re.compile(r"^go\s+(\S+)\s*$", re.MULTILINE)


def helm_go_mod(helm_mod: str) -> str:
    """The wrapper ``go.mod`` from Helm's own: its ``go`` line, requiring the pinned module (Helm's
    ``go.mod`` has no ``replace`` lines to carry over; the dependency versions are its own)."""
    go_match = _GO_DIRECTIVE.search(helm_mod)
    return wrapper_go_mod([(HELM_MODULE, HELM)], go=go_match.group(1) if go_match else "1.26.0")


def helm_build(helm_mod: str) -> GoBuild:
    """``helm`` (``cmd/helm``) with the release stamped in, one cache entry ``helm-<pin>``."""
    ldflags = (f"-s -w -X {HELM_MODULE}/internal/version.version={HELM} "
               f"-X {HELM_MODULE}/internal/version.metadata= -X {HELM_MODULE}/internal/version.gitTreeState=clean")
    return GoBuild(key=f"helm-{HELM}", go_mod=helm_go_mod(helm_mod), ldflags=ldflags,
                   programs=(GoProgram(HELM_COMMAND, f"{HELM_MODULE}/cmd/{HELM_COMMAND}"),))


def _cached_mod_file() -> Path:
    """Where the module cache keeps Helm's ``go.mod`` once downloaded."""
    return Path(go_env()["GOMODCACHE"]) / "cache" / "download" / HELM_MODULE / "@v" / f"{HELM}.mod"


def cached_helm() -> Path | None:
    """The built ``helm`` if its cache entry is complete (a few ``stat`` calls, one small read), else
    ``None``."""
    try:
        spec = helm_build(_cached_mod_file().read_text())
    except OSError:
        return None
    return spec.paths()[HELM_COMMAND] if spec.is_built() else None


def ensure_helm(log: Log = quiet) -> Path:
    """``helm``, built first if the cache lacks it (a cold build takes minutes).

    Raises :class:`~gpupool.testenv.errors.BuildImpossibleError` (no Go, no module proxy) or
    :class:`~gpupool.testenv.errors.BuildFailedError` (a build step failed; the message names its log).
    """
    def make(logs: Path) -> None:
        source = module_dir(HELM_MODULE, HELM, logs=logs, log=log)
        build(helm_build((source / "go.mod").read_text()), logs=logs, log=log)

    found = ensure_built(cached_helm, make, what=f"{HELM_MODULE} {HELM}", lock_name=BUILD_LOCK,
                         problem=toolchain_problem, lock=exclusive_lock, log=log)
    log(f"Helm {HELM} ready")
    return found
