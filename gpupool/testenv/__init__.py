"""A real Kubernetes (v1.20.2) on this machine for end-to-end tests; see docs/testenv.md.

Public API (everything else is an implementation detail):

* :func:`ensure_binaries` builds, once, and returns the :class:`Binaries` (cached outside the repo).
* :func:`start_control_plane` starts etcd + kube-apiserver + kube-scheduler; :class:`ControlPlane`.
* :func:`start_kubelet` starts a real kubelet with a fake container runtime; :class:`Kubelet`.
* :class:`ExtenderConfig` points the scheduler at an extender (``ControlPlane.restart_scheduler``).

The modules are small on purpose: ``build`` (compile), ``controlplane``, ``kubelet``, ``config``
(pure renderers), ``pki``, ``ports``, ``nodeip``, ``procs`` (child processes), ``probe`` (HTTP
readiness) and ``statefile`` (what ``gpupool testenv up`` leaves for ``down``).
"""

from gpupool.testenv.build import build_impossible_reason, ensure_binaries
from gpupool.testenv.config import ExtenderConfig
from gpupool.testenv.controlplane import ControlPlane, start_control_plane
from gpupool.testenv.errors import BuildFailedError, BuildImpossibleError, StartupError, TestenvError
from gpupool.testenv.kubelet import Kubelet, start_kubelet
from gpupool.testenv.paths import Binaries

__all__ = [
    "Binaries",
    "BuildFailedError",
    "BuildImpossibleError",
    "ControlPlane",
    "ExtenderConfig",
    "Kubelet",
    "StartupError",
    "TestenvError",
    "build_impossible_reason",
    "ensure_binaries",
    "start_control_plane",
    "start_kubelet",
]
