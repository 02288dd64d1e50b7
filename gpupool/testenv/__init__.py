"""A real, current Kubernetes (v1.37.2 by default; the pins are in ``versions``) on this machine for
end-to-end tests; see docs/testenv.md.

Public API (everything else is an implementation detail):

* :func:`ensure_binaries` builds, once, and returns the :class:`Binaries` (cached outside the repo).
* :func:`start_control_plane` starts etcd + kube-apiserver + kube-scheduler; :class:`ControlPlane`.
* :func:`start_kubelet` starts a real kubelet with the fake container runtime, or with containerd
  (``runtime="containerd"``: real containers); :class:`Kubelet`.
* :func:`build_image` builds a local image (busybox, plus the host's loader and libc by default,
  plus your files) for ``Kubelet.import_image``; :class:`DeviceNode` makes stand-in device nodes.
* :class:`ExtenderConfig` points the scheduler at an extender (``ControlPlane.restart_scheduler``).
* :func:`start_kwok` runs KWOK against a control plane: thousands of simulated nodes (those carrying
  ``kwok.x-k8s.io/node: fake``) kept Ready, their Leases renewed, their bound pods Running.

The modules are small on purpose: ``versions`` (every pinned release), ``gobuild`` (Go programs
from published modules into the cache), ``build`` (Kubernetes, etcd, the fake runtime), ``steps``
(lock, logged step, atomic install), ``controlplane``, ``kubelet``, ``config``
(pure renderers), ``pki``, ``ports``, ``nodeip``, ``procs`` (child processes), ``probe`` (HTTP
readiness), ``statefile`` (what ``gpupool testenv up`` leaves for ``down``), ``mountns`` (a node's
private mount namespace), ``node_runtime`` (fake or containerd), ``containerd`` and
``containerd_config``, ``runtime_tools`` (containerd, runc and CNI built from their modules;
busybox, gcc from apt), ``images`` and ``image_archive`` (docker-archive images built from host
files), ``kwok`` (KWOK built from its module, its stages and flags).
"""

from gpupool.testenv.build import build_impossible_reason, ensure_binaries
from gpupool.testenv.config import ExtenderConfig
from gpupool.testenv.containerd import DeviceNode
from gpupool.testenv.controlplane import ControlPlane, start_control_plane
from gpupool.testenv.errors import BuildFailedError, BuildImpossibleError, StartupError, TestenvError
from gpupool.testenv.images import Base, Image, build_image
from gpupool.testenv.kubelet import Kubelet, start_kubelet
from gpupool.testenv.kwok import KwokOptions, ensure_kwok, start_kwok
from gpupool.testenv.node_runtime import NodeImages, RuntimeKind
from gpupool.testenv.paths import Binaries

__all__ = [
    "Base",
    "Binaries",
    "BuildFailedError",
    "BuildImpossibleError",
    "ControlPlane",
    "DeviceNode",
    "ExtenderConfig",
    "Image",
    "Kubelet",
    "KwokOptions",
    "NodeImages",
    "RuntimeKind",
    "StartupError",
    "TestenvError",
    "build_image",
    "build_impossible_reason",
    "ensure_binaries",
    "ensure_kwok",
    "start_control_plane",
    "start_kubelet",
    "start_kwok",
]
