"""The MPS backend: the agent runs the control daemon; containers reach it through two mounts.

The per-client limits need no call to the daemon: the CUDA driver of each client reads
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` from the client's
environment, which every grant already carries (:mod:`gpupool.api.environment`). What a container
needs besides is the daemon's pipe directory (read-write: clients connect to the daemon's sockets
there) and its log directory (read-only), at MPS's default paths, named in the environment too.

::

    <state>/mps/pipe   CUDA_MPS_PIPE_DIRECTORY of the daemon → /tmp/nvidia-mps in the container
    <state>/mps/log    CUDA_MPS_LOG_DIRECTORY of the daemon  → /var/log/nvidia-mps (read-only)

The backend enforces while the daemon runs; a card's shares are reported unenforced while it is
down (the supervisor restarts it). Whether the kernel's ``dmem`` controller is usable is reported
alongside (:mod:`gpupool.nodeagent.isolation.dmem`): NVIDIA's MPS v3 memory partitioning uses it
where the driver and kernel offer it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpupool.api import environment as env
from gpupool.nodeagent.isolation.backends import EnforcementState, IsolationBackend, LivePods
from gpupool.nodeagent.isolation.dmem import DmemStatus
from gpupool.nodeagent.isolation.mps_daemon import MpsDaemonSupervisor
from gpupool.nodeagent.types import GrantExtras, Mount, PodView

CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
CONTAINER_LOG_DIR = "/var/log/nvidia-mps"


@dataclass(frozen=True)
class MpsLayout:
    """The host directories of the daemon."""

    state_dir: str

    @property
    def pipe_dir(self) -> str:
        return os.path.join(self.state_dir, "mps", "pipe")

    @property
    def log_dir(self) -> str:
        return os.path.join(self.state_dir, "mps", "log")


def daemon_command(layout: MpsLayout, control: str) -> tuple[list[str], dict[str, str]]:
    """The control daemon's command line and the environment that places its directories."""
    return [control, "-f"], {env.MPS_PIPE_DIRECTORY: layout.pipe_dir, env.MPS_LOG_DIRECTORY: layout.log_dir}


class MpsEnforcement:
    """:class:`~gpupool.nodeagent.isolation.backends.Enforcement` with NVIDIA MPS."""

    def __init__(self, layout: MpsLayout, control: str, dmem: DmemStatus,
                 supervisor: MpsDaemonSupervisor | None = None) -> None:
        for path in (layout.pipe_dir, layout.log_dir):
            os.makedirs(path, mode=0o755, exist_ok=True)
        self.layout = layout
        self.dmem = dmem
        self.supervisor = supervisor or MpsDaemonSupervisor(*daemon_command(layout, control))
        self._extras = GrantExtras(
            {env.MPS_PIPE_DIRECTORY: CONTAINER_PIPE_DIR, env.MPS_LOG_DIRECTORY: CONTAINER_LOG_DIR},
            (Mount(layout.pipe_dir, CONTAINER_PIPE_DIR, read_only=False),
             Mount(layout.log_dir, CONTAINER_LOG_DIR, read_only=True)))

    def grant_extras(self, pod: PodView, container: str) -> GrantExtras:
        return self._extras

    def state(self) -> EnforcementState:
        daemon = self.supervisor.state()
        memory = "memory also by dmem" if self.dmem.usable else f"dmem: {self.dmem.reason}"
        if daemon.running:
            return EnforcementState(IsolationBackend.MPS, True, f"daemon pid {daemon.pid}; {memory}")
        return EnforcementState(IsolationBackend.MPS, False,
                                f"MPS control daemon not running ({daemon.last_exit or 'starting'}); {memory}")

    async def run(self, live_pods: LivePods) -> None:
        await self.supervisor.run()
