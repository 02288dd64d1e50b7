"""Where the test environment keeps its binaries and its per-run state.

The binaries are expensive (minutes of compiling) and identical for every run, so they live in a
cache outside the repository, one entry per program set and version
(``kubernetes-v1.37.2/bin``, ``etcd-v3.7.0/bin``, ...); everything a run writes (etcd data, keys,
logs, sockets) lives in a fresh state directory under ``/tmp`` that is removed when the run stops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: Environment variable that moves the cache (the directory that holds every entry).
CACHE_ENV = "GPUPOOL_TESTENV_CACHE"

#: The Kubernetes programs built from ``k8s.io/kubernetes`` (binary name → ``cmd/`` package).
#: kube-controller-manager runs only when a test asks for controllers, kubectl only in tests of the
#: kubectl plugin and the deploy package, but all are built together so that an entry is complete
#: or absent.
K8S_COMMANDS = ("kube-apiserver", "kube-scheduler", "kubelet", "kube-controller-manager", "kubectl")

#: Name of the project's fake CRI runtime.
FAKECRI_COMMAND = "gpupool-fakecri"


def cache_dir() -> Path:
    """The cache root: ``$GPUPOOL_TESTENV_CACHE`` or ``~/.cache/gpupool/testenv``."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "gpupool" / "testenv"


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of every executable the test environment runs, and their release."""

    kube_apiserver: Path
    kube_scheduler: Path
    kubelet: Path
    fakecri: Path
    etcd: Path
    kube_controller_manager: Path
    kubectl: Path
    version: str = ""
    """The Kubernetes release these binaries are (``v1.37.2``)."""

    def missing(self) -> list[Path]:
        """The paths that are not executable files (empty when everything is in place)."""
        paths = [self.kube_apiserver, self.kube_scheduler, self.kubelet, self.kube_controller_manager,
                 self.kubectl, self.fakecri, self.etcd]
        return [p for p in paths if not (p.is_file() and os.access(p, os.X_OK))]
