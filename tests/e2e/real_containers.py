"""Shared pieces of end-to-end tests in real containers (a kubelet with containerd).

Use the module-scoped fixture by naming it in a test module (pytest finds fixtures among a
module's names)::

    from tests.e2e import real_containers

    containerd_kubelet = real_containers.containerd_kubelet  # the module's node (a fixture)

    def test_x(containerd_kubelet: Kubelet) -> None:
        image = build_image("mine", {"/lib/x86_64-linux-gnu/libcuda.so.1": stub})
        containerd_kubelet.import_image(image)   # then a pod names image.ref, imagePullPolicy Never

The node has the NVIDIA control devices as stand-ins (:data:`CONTROL_NODES`), so a device plugin's
grant that lists them can start; :func:`stand_in_cards` makes card devices the host sees too.

Two real kubelets on one machine collide (both use ``/var/lib/kubelet/pods-api``). Where two pytest
runs may overlap (``scripts/test-all`` runs the compatibility set beside the end-to-end suite), name a
lock file in ``$GPUPOOL_REAL_KUBELET_LOCK``: the fixture holds an exclusive lock on it from before
its kubelet starts until after it stops. Never name a file an outer ``flock`` already holds (the
fixture would wait on its own parent). ``scripts/test-all`` names the machine-wide
``/tmp/gpupool-real-kubelet.lock``, which a run by hand takes with ``flock``: runs that overlap also
see each other's cards, since every run's stand-in cards have the same device numbers and the usage
monitor knows a card by its number (another run's container holding its ``nvidia0`` is a holder of
this run's card 0).
"""

from __future__ import annotations

import fcntl
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kubernetes import client

from gpupool.testenv.containerd import DeviceNode
from gpupool.testenv.controlplane import ControlPlane
from gpupool.testenv.errors import BuildImpossibleError
from gpupool.testenv.kubelet import Kubelet, start_kubelet
from gpupool.testenv.runtime_tools import ensure_runtime_tools, runtime_impossible_reason

#: The control devices every gpupool grant lists (``/dev/null``'s numbers): they need only exist
#: for the runtime to create them in the container.
CONTROL_NODES = tuple(DeviceNode(p, 1, 3) for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"))

#: Environment variable naming the lock file real kubelets of overlapping pytest runs share.
REAL_KUBELET_LOCK_ENV = "GPUPOOL_REAL_KUBELET_LOCK"

#: Stand-in card devices: ``(major, minor)`` of /dev/random and /dev/urandom, distinct and openable.
CARD_DEVICES = ((1, 8), (1, 9))


@pytest.fixture(scope="module")
def containerd_kubelet(control_plane: ControlPlane, kube_api_client: client.ApiClient) -> Iterator[Kubelet]:
    """A real kubelet with containerd for the module; skipped, with the reason, only where the
    runtime cannot be installed (not root, no apt, no route to Debian)."""
    reason = runtime_impossible_reason()
    if reason is not None:
        pytest.skip(f"real containers cannot run on this machine: {reason}")
    try:
        ensure_runtime_tools(log=lambda m: print(f"[gpupool testenv] {m}", flush=True))
    except BuildImpossibleError as exc:
        pytest.skip(f"real containers cannot run on this machine: {exc}")
    with one_real_kubelet_at_a_time():
        began = time.monotonic()
        kubelet = start_kubelet(control_plane, f"e2e-real-{uuid.uuid4().hex[:6]}", runtime="containerd",
                                device_nodes=CONTROL_NODES)
        print(f"\n  containerd kubelet start to node Ready: {time.monotonic() - began:.1f} s")
        try:
            yield kubelet
        finally:
            kubelet.stop(delete_node=True)


@contextmanager
def one_real_kubelet_at_a_time() -> Iterator[None]:
    """Hold the lock named by ``$GPUPOOL_REAL_KUBELET_LOCK`` (nothing when unset): a real kubelet of
    another pytest run waits for this one to stop instead of colliding with it."""
    path = os.environ.get(REAL_KUBELET_LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a") as lock:
        began = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        waited = time.monotonic() - began
        if waited >= 1:
            print(f"\n  waited {waited:.0f} s for the other run's real kubelet ({path})")
        yield


def stand_in_cards(directory: Path, model: str = "Tesla-T4", memory_mib: int = 16384) -> str:
    """Make one character device per :data:`CARD_DEVICES` in ``directory`` (``nvidia0`` ...); return
    a ``--fake-gpus`` file whose ``devicePathPrefix`` points the node agent at them."""
    directory.mkdir(parents=True)
    for index, (major, minor) in enumerate(CARD_DEVICES):
        os.mknod(directory / f"nvidia{index}", 0o666 | 0o020000, os.makedev(major, minor))
    cards = "\n".join(f"  - {{uuid: GPU-real-{i:04d}, memoryMiB: {memory_mib}}}" for i in range(len(CARD_DEVICES)))
    return f"model: {model}\ndevicePathPrefix: {directory}/nvidia\ncards:\n{cards}\n"
