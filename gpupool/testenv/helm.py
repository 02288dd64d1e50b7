"""Helm, built from its pinned Go module, for the tests of ``charts/gpupool``.

The chart is linted, rendered and installed by a real ``helm`` (docs/helm.md), and no package
registry this project uses ships one (Debian 12 has none; PyPI's Helm packages wrap a binary
installed separately). Helm publishes its module (``helm.sh/helm/v4``, and ``helm.sh/helm/v3`` for
the 3.x line) at every release tag with no ``replace`` lines, so a wrapper module requiring the pin
(:data:`~gpupool.testenv.versions.HELM`, :data:`~gpupool.testenv.versions.HELM3`) builds
``cmd/helm`` exactly as released; the version is stamped in as Helm's Makefile does, so ``helm
version`` names the pin. Helm 3 also takes the Kubernetes version its client-go speaks from the
Makefile (without it, it renders for Kubernetes 1.20 and refuses the chart's ``kubeVersion``); Helm 4
reads it from the build. Under its own lock: it never waits behind a Kubernetes build.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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
from gpupool.testenv.versions import HELM, HELM3

__all__ = ["HELM_3", "HELM_4", "HELM_COMMAND", "HELM_MODULE", "HelmRelease", "cached_helm", "ensure_helm",
           "helm_build", "helm_go_mod"]

HELM_COMMAND = "helm"


@dataclass(frozen=True)
class HelmRelease:
    """One pinned Helm: its module (one per major version) and the release tag."""

    module: str
    version: str
    kube_version_stamp: bool = False
    """Whether the build stamps the Kubernetes version of its client-go in (Helm 3's Makefile does;
    Helm 4 reads it from the build information)."""


HELM_4 = HelmRelease("helm.sh/helm/v4", HELM)
HELM_3 = HelmRelease("helm.sh/helm/v3", HELM3, kube_version_stamp=True)
HELM_MODULE = HELM_4.module

#: Helm's build takes its own lock, so it never waits behind a Kubernetes or runtime build.
BUILD_LOCK = ".helm-build.lock"

_GO_DIRECTIVE = re.compile(r"^go\s+(\S+)\s*$", re.MULTILINE)
_CLIENT_GO = re.compile(r"^\s*k8s\.io/client-go\s+v0\.(\d+)\.", re.MULTILINE)


def helm_go_mod(helm_mod: str, release: HelmRelease = HELM_4) -> str:
    """The wrapper ``go.mod`` from Helm's own: its ``go`` line, requiring the pinned module (Helm's
    ``go.mod`` has no ``replace`` lines to carry over; the dependency versions are its own)."""
    go_match = _GO_DIRECTIVE.search(helm_mod)
    return wrapper_go_mod([(release.module, release.version)], go=go_match.group(1) if go_match else "1.26.0")


def _kube_version_ldflags(helm_mod: str, release: HelmRelease) -> str:
    """Helm 3's Makefile stamps the Kubernetes minor of its client-go (``v0.N`` → 1.N) into the lint
    rules and the default capabilities; without it ``helm template`` assumes Kubernetes 1.20."""
    match = _CLIENT_GO.search(helm_mod)
    if not release.kube_version_stamp or match is None:
        return ""
    minor = match.group(1)
    return "".join(f" -X {release.module}/pkg/{package}.k8sVersionMajor=1 "
                   f"-X {release.module}/pkg/{package}.k8sVersionMinor={minor}"
                   for package in ("lint/rules", "chartutil"))


def helm_build(helm_mod: str, release: HelmRelease = HELM_4) -> GoBuild:
    """``helm`` (``cmd/helm``) with the release stamped in, one cache entry ``helm-<pin>``."""
    module = release.module
    ldflags = (f"-s -w -X {module}/internal/version.version={release.version} "
               f"-X {module}/internal/version.metadata= -X {module}/internal/version.gitTreeState=clean"
               f"{_kube_version_ldflags(helm_mod, release)}")
    return GoBuild(key=f"helm-{release.version}", go_mod=helm_go_mod(helm_mod, release), ldflags=ldflags,
                   programs=(GoProgram(HELM_COMMAND, f"{module}/cmd/{HELM_COMMAND}"),))


def _cached_mod_file(release: HelmRelease = HELM_4) -> Path:
    """Where the module cache keeps Helm's ``go.mod`` once downloaded."""
    return Path(go_env()["GOMODCACHE"]) / "cache" / "download" / release.module / "@v" / f"{release.version}.mod"


def cached_helm(release: HelmRelease = HELM_4) -> Path | None:
    """The built ``helm`` of ``release`` if its cache entry is complete (a few ``stat`` calls, one
    small read), else ``None``."""
    try:
        spec = helm_build(_cached_mod_file(release).read_text(), release)
    except OSError:
        return None
    return spec.paths()[HELM_COMMAND] if spec.is_built() else None


def ensure_helm(log: Log = quiet, release: HelmRelease = HELM_4) -> Path:
    """``helm`` of ``release``, built first if the cache lacks it (a cold build takes minutes).

    Raises :class:`~gpupool.testenv.errors.BuildImpossibleError` (no Go, no module proxy) or
    :class:`~gpupool.testenv.errors.BuildFailedError` (a build step failed; the message names its log).
    """
    def make(logs: Path) -> None:
        source = module_dir(release.module, release.version, logs=logs, log=log)
        build(helm_build((source / "go.mod").read_text(), release), logs=logs, log=log)

    found = ensure_built(lambda: cached_helm(release), make, what=f"{release.module} {release.version}",
                         lock_name=BUILD_LOCK, problem=toolchain_problem, lock=exclusive_lock, log=log)
    log(f"Helm {release.version} ready")
    return found
