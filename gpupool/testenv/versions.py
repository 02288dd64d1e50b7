"""Every version the test environment builds, pinned in this one place.

Why pin here and not in a ``go.mod`` in the repository: a Kubernetes release is built from the
published ``k8s.io/kubernetes`` module with its staging modules (``k8s.io/api``, ...) replaced by
the matching ``v0.x`` releases, and that replace list differs between releases. So the wrapper
module is generated per release (:mod:`gpupool.testenv.gobuild`) and only the release names live
here. ``gpupool testenv up`` prints the release it runs.

Supported releases are the three newest minors upstream supports; :data:`NEWEST` is the default
and runs the whole end-to-end suite, :data:`OLDEST` runs the compatibility set
(``pytest -m compat``). etcd is the release the newest Kubernetes names in its
``build/dependencies.yaml`` (the older minors name 3.6 releases; etcd 3.7 serves them the same
API, and one etcd keeps a cold build shorter); containerd, runc, CNI plugins and KWOK are the
newest releases at the time of pinning, shared by every Kubernetes release.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    """One Kubernetes release."""

    kubernetes: str

    @property
    def staging(self) -> str:
        """The ``v0.x.y`` version of the staging modules published with this release."""
        _major, minor, patch = self.kubernetes.removeprefix("v").split(".")
        return f"v0.{minor}.{patch}"

    @property
    def minor(self) -> str:
        """``"1.37"`` for ``v1.37.2``."""
        return ".".join(self.kubernetes.removeprefix("v").split(".")[:2])


#: Newest first: the three minors upstream supports, each at its newest patch on the module proxy.
RELEASES = (
    Release(kubernetes="v1.37.2"),
    Release(kubernetes="v1.36.3"),
    Release(kubernetes="v1.35.4"),
)
NEWEST = RELEASES[0]
OLDEST = RELEASES[-1]

#: etcd (``go.etcd.io/etcd/server/v3``), shared by every release.
ETCD = "v3.7.0"
#: containerd 2 (the kubelets of the newest minors refuse 1.x) and its shim, built from Go modules.
CONTAINERD = "v2.4.2"
#: runc, built from its Go module (cgo, with seccomp: kubelet asks ``RuntimeDefault`` for every
#: pod sandbox, and a runc without seccomp refuses it).
RUNC = "v1.5.3"
#: The CNI plugins the pod network uses (bridge, host-local, loopback).
CNI_PLUGINS = "v1.10.0"
#: KWOK: thousands of simulated nodes against the real apiserver.
KWOK = "v0.8.0"
#: Helm (``helm.sh/helm/v4``), which lints, renders and installs ``charts/gpupool`` in the tests.
#: Helm 4 rather than 3: Helm 3 receives only security fixes until its end of life (November 2026),
#: and 4.3.1 is built against client-go v0.37, the newest release above (docs/helm.md).
HELM = "v4.3.1"
#: Helm 3 (``helm.sh/helm/v3``), the newest 3.x the module proxy serves: many clusters are still
#: managed with Helm 3, so the chart is linted and rendered with both (docs/helm.md).
HELM3 = "v3.22.0"

#: Environment variable that selects a release for a whole test session (``v1.35.4`` or ``1.35``).
VERSION_ENV = "GPUPOOL_TESTENV_K8S_VERSION"


def release(version: str | None = None) -> Release:
    """The pinned release named ``version`` (``v1.35.4``, ``1.35.4``, the minor ``1.35``, or
    ``newest``/``oldest``), else the one ``$GPUPOOL_TESTENV_K8S_VERSION`` names, else :data:`NEWEST`.

    Raises ``ValueError`` naming the supported releases for any other version.
    """
    wanted = version or os.environ.get(VERSION_ENV) or NEWEST.kubernetes
    aliases = {"newest": NEWEST, "oldest": OLDEST}
    if wanted in aliases:
        return aliases[wanted]
    normalized = wanted if wanted.startswith("v") else f"v{wanted}"
    for candidate in RELEASES:
        if normalized in (candidate.kubernetes, f"v{candidate.minor}"):
            return candidate
    supported = ", ".join(r.kubernetes for r in RELEASES)
    raise ValueError(f"Kubernetes {wanted} is not a release the test environment pins (supported: {supported})")
