"""Where the test environment keeps its binaries and its per-run state.

The binaries are expensive (minutes of compiling) and identical for every run, so they live in a
cache outside the repository; everything a run writes (etcd data, keys, logs, sockets) lives in a
fresh state directory under ``/tmp`` that is removed when the run stops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: The Kubernetes release that Debian's ``kubernetes`` source package really contains.
K8S_VERSION = "v1.20.2"

#: Environment variable that moves the cache (the directory that holds ``bin/``).
CACHE_ENV = "GPUPOOL_TESTENV_CACHE"

#: Names of the binaries built from the Kubernetes tree, in ``make WHAT=...`` order.
#: kube-controller-manager runs only when a test asks for controllers (Deployments, ReplicaSets,
#: garbage collection), but is built with the rest so that a cache is complete or not at all.
K8S_COMMANDS = ("kube-apiserver", "kube-scheduler", "kubelet", "kube-controller-manager")

#: Name of the project's fake CRI runtime main, built in the same tree.
FAKECRI_COMMAND = "gpupool-fakecri"


def cache_dir() -> Path:
    """The cache root: ``$GPUPOOL_TESTENV_CACHE`` or ``~/.cache/gpupool/k8s-v1.20.2``."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "gpupool" / f"k8s-{K8S_VERSION}"


def bin_dir() -> Path:
    """Directory holding the built binaries (``<cache>/bin``)."""
    return cache_dir() / "bin"


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of every executable the test environment runs."""

    kube_apiserver: Path
    kube_scheduler: Path
    kubelet: Path
    fakecri: Path
    etcd: Path
    kube_controller_manager: Path

    @classmethod
    def in_dir(cls, directory: Path, etcd: Path, fakecri: Path | None = None) -> Binaries:
        """The binaries as laid out by the build in ``directory``, plus the system's etcd; the fake
        runtime at ``fakecri`` (the build keys it by its source's hash) or in ``directory``."""
        return cls(
            kube_apiserver=directory / "kube-apiserver",
            kube_scheduler=directory / "kube-scheduler",
            kubelet=directory / "kubelet",
            fakecri=fakecri or directory / FAKECRI_COMMAND,
            etcd=etcd,
            kube_controller_manager=directory / "kube-controller-manager",
        )

    def missing(self) -> list[Path]:
        """The paths that are not executable files (empty when everything is in place)."""
        paths = [self.kube_apiserver, self.kube_scheduler, self.kubelet, self.kube_controller_manager,
                 self.fakecri, self.etcd]
        return [p for p in paths if not (p.is_file() and os.access(p, os.X_OK))]
