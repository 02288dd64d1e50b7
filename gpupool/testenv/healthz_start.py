"""Starting a component that serves ``/healthz`` on a port chosen just before it starts.

Between :func:`~gpupool.testenv.ports.free_ports` and the component's bind another process can take
the port, so a start whose ``/healthz`` never answers is retried with a fresh port.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from gpupool.testenv.errors import StartupError
from gpupool.testenv.ports import free_ports
from gpupool.testenv.probe import is_ok
from gpupool.testenv.procs import ManagedProcess, wait_until

START_ATTEMPTS = 3


def start_with_healthz(what: str, start: Callable[[int], ManagedProcess], timeout: float, *,
                       scheme: str = "https") -> ManagedProcess:
    """``start(healthz_port)`` until its ``<scheme>://127.0.0.1:<port>/healthz`` answers; the last
    :class:`StartupError` after :data:`START_ATTEMPTS` tries.

    Current kube-scheduler and kube-controller-manager serve health only on their secure port,
    with a certificate they make up at start, so the probe does not verify it (loopback only).
    """
    last_error: StartupError | None = None
    for _ in range(START_ATTEMPTS):
        (healthz_port,) = free_ports(1)
        process = start(healthz_port)
        try:
            wait_until(partial(is_ok, f"{scheme}://127.0.0.1:{healthz_port}/healthz", verify=False),
                       what=f"{what} /healthz", timeout=timeout, watch=[process])
            return process
        except StartupError as exc:
            last_error = exc
            process.stop()
    assert last_error is not None
    raise last_error
