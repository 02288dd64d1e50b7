"""kube-controller-manager for the tests that need a workload's controller: a Deployment's
ReplicaSet that replaces a pod kubelet refused, for example.

Why only on request, and only some controllers: the control plane is shared by a whole test
session, and most tests must see exactly the API behaviour they cause. So the controller-manager
starts when a test asks (:meth:`gpupool.testenv.controlplane.ControlPlane.start_controllers`) with
:data:`DEFAULT_CONTROLLERS`, and stops when it is done. None of those controllers needs the
controllers the environment leaves out: pods are created without service-account tokens (the
``ServiceAccount`` admission plugin stays disabled, so no ``serviceaccount`` or token controller is
needed), no node is tainted (no node lifecycle controller), and nothing is garbage-collected.

Health comes from the secure port on loopback (current releases serve nothing else); ``/healthz``
needs no credentials there.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpupool.testenv.healthz_start import start_with_healthz
from gpupool.testenv.paths import Binaries
from gpupool.testenv.procs import ManagedProcess, spawn

#: What a workload's replacement needs: Deployments make ReplicaSets, ReplicaSets make pods.
DEFAULT_CONTROLLERS = ("deployment", "replicaset")


def controller_manager_args(*, kubeconfig: Path, healthz_port: int, controllers: Sequence[str]) -> list[str]:
    """kube-controller-manager's flags (without the binary); a pure function for tests and docs."""
    if not controllers:
        raise ValueError("name at least one controller (e.g. deployment, replicaset)")
    return [
        f"--kubeconfig={kubeconfig}",
        f"--controllers={','.join(controllers)}",
        "--leader-elect=false",
        "--use-service-account-credentials=false",  # every controller acts with the admin token
        "--bind-address=127.0.0.1", f"--secure-port={healthz_port}",
        "--concurrent-deployment-syncs=2", "--concurrent-replicaset-syncs=2",
        "--v=2",
    ]


def start_controller_manager(binaries: Binaries, state_dir: Path, kubeconfig: Path,
                             controllers: Sequence[str] = DEFAULT_CONTROLLERS, *,
                             timeout: float = 60.0) -> ManagedProcess:
    """Start kube-controller-manager with ``controllers`` and wait for its ``/healthz``; a start that
    loses a port race is retried with a fresh port."""
    def start(healthz_port: int) -> ManagedProcess:
        args = controller_manager_args(kubeconfig=kubeconfig, healthz_port=healthz_port, controllers=controllers)
        return spawn("kube-controller-manager", [binaries.kube_controller_manager, *args],
                     state_dir / "logs" / "kube-controller-manager.log")

    return start_with_healthz("kube-controller-manager", start, timeout)
