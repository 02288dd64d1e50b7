"""Build the node's enforcement backend from ``gpupool node-agent``'s options."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpupool.api.environment import COMPUTE_MODE_HARD
from gpupool.nodeagent.containers.container_directory import ContainerDirectory
from gpupool.nodeagent.isolation.backends import (
    AUTO,
    BackendChoice,
    Enforcement,
    IsolationBackend,
    NoEnforcement,
    choose_backend,
)
from gpupool.nodeagent.isolation.dmem import CGROUP_ROOT, DmemStatus, detect_dmem
from gpupool.nodeagent.isolation.dmem_backend import DmemEnforcement
from gpupool.nodeagent.isolation.dmem_limits import DmemLimiter
from gpupool.nodeagent.isolation.mps_backend import MpsEnforcement, MpsLayout
from gpupool.nodeagent.isolation.mps_daemon import DEFAULT_MPS_CONTROL
from gpupool.nodeagent.isolation.shim_backend import ShimEnforcement
from gpupool.nodeagent.isolation.shim_files import DEFAULT_STATE_DIR, ShimLayout
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry
from gpupool.nodeagent.isolation.shim_socket import RegistrationLimits
from gpupool.nodeagent.linux.procfs import PROC
from gpupool.nodeagent.monitor.container_resolver import ContainerResolver

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IsolationConfig:
    """The options that choose and configure the backend."""

    requested: str = AUTO
    shim_library: str | None = None
    state_dir: str = DEFAULT_STATE_DIR
    compute_mode: str = COMPUTE_MODE_HARD
    mps_control: str = DEFAULT_MPS_CONTROL
    cgroup_root: str = CGROUP_ROOT
    proc: str = PROC
    registration: RegistrationLimits = field(default_factory=RegistrationLimits)
    packaged: str | None = None
    """The interception library installed with gpupool (:func:`~gpupool.nodeagent.isolation.backends.packaged_library`):
    what ``auto`` enforces with when no ``shim_library`` is given."""
    library_problem: str = ""
    """Why the chosen interception library cannot be loaded on this node ("" when it can or was not
    probed): such a node is one without enforcement (:func:`~gpupool.nodeagent.isolation.backends.choose_backend`)."""

    def choice(self) -> BackendChoice:
        """The backend these options choose (an impossible request raises
        :class:`~gpupool.nodeagent.isolation.backends.IsolationConfigError`)."""
        return choose_backend(self.requested, self.shim_library, self.packaged, self.library_problem)


def build_enforcement(config: IsolationConfig, directory: ContainerDirectory,
                      pci_bus_ids: Mapping[int, str] | None = None) -> Enforcement:
    """The backend ``config`` asks for (an impossible request raises
    :class:`~gpupool.nodeagent.isolation.backends.IsolationConfigError` or ``OSError``), with
    ``dmem`` limits beside it where the kernel offers the controller (``pci_bus_ids``: card index →
    NVML's PCI bus id, which names each card's region)."""
    choice = config.choice()
    dmem = detect_dmem(config.cgroup_root)
    log.info("isolation backend: %s (%s); dmem: %s", choice.backend, choice.reason,
             "usable" if dmem.usable else dmem.reason)
    if choice.backend is IsolationBackend.NONE:
        if choice.shares:
            log.warning("shares are NOT enforced on this node (--isolation none): a container granted part of "
                        "a card can use all of it")
        else:
            log.warning("no GPU shares on this node, whole cards only: %s", choice.reason)
        return NoEnforcement(choice.reason)
    inner: Enforcement
    if choice.backend is IsolationBackend.MPS:
        inner = MpsEnforcement(MpsLayout(config.state_dir), config.mps_control, dmem)
    else:
        registry = ShimRegistry(ContainerResolver(directory, config.proc).cgroup_identity, directory, config.proc,
                                heartbeat_s=config.registration.heartbeat_s)
        inner = ShimEnforcement(choice.library or "", ShimLayout(config.state_dir), registry,
                                config.compute_mode, registration=config.registration)
    return with_dmem(inner, dmem, pci_bus_ids or {}, directory, config.cgroup_root)


def with_dmem(inner: Enforcement, dmem: DmemStatus, pci_bus_ids: Mapping[int, str],
              directory: ContainerDirectory, cgroup_root: str) -> Enforcement:
    """``inner`` with ``dmem.max`` limits where the kernel has the controller, else ``inner`` as is."""
    if not dmem.controller:
        return inner
    limiter = DmemLimiter(dmem, pci_bus_ids, directory, cgroup_root)
    for card in limiter.regions.values():
        log.info("card %d: dmem %s", card.card, f"region {card.region}" if card.region else card.reason)
    return DmemEnforcement(inner, limiter)
