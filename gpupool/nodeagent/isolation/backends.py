"""Which backend enforces the shares on this node, and the port every backend implements.

One backend per node (``gpupool node-agent --isolation``):

* ``shim``: the interception library, preloaded into every process of a container with a share
  (needs ``--shim-library``);
* ``mps``: NVIDIA's MPS control daemon, run by the agent; the CUDA driver in each client applies
  the pinned-memory and active-thread limits the environment contract already carries;
* ``none``: the limits are only written into the environment; nothing holds a container to them;
* ``auto`` (the default) is a request, not a backend: ``shim`` when a library is configured,
  otherwise ``none`` with a warning. MPS is never chosen implicitly: it changes how every CUDA
  process on the node reaches its cards, which an admin should decide.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from gpupool.nodeagent.isolation.dmem_limits import DmemReport
from gpupool.nodeagent.types import GrantExtras, PodView

PodKey = tuple[str, str]


class IsolationBackend(StrEnum):
    """What holds a container to its share on this node."""

    SHIM = "shim"
    MPS = "mps"
    NONE = "none"


AUTO = "auto"
CHOICES = (AUTO, *(b.value for b in IsolationBackend))


class IsolationConfigError(ValueError):
    """The requested backend cannot run with the given options."""


@dataclass(frozen=True)
class BackendChoice:
    """The backend chosen and why (logged at start)."""

    backend: IsolationBackend
    reason: str


def choose_backend(requested: str, shim_library: str | None) -> BackendChoice:
    """The backend for ``--isolation requested``; an impossible request is an error, not a fallback."""
    if requested not in CHOICES:
        raise IsolationConfigError(f"--isolation {requested!r}: expected one of {', '.join(CHOICES)}")
    if requested == IsolationBackend.SHIM and not shim_library:
        raise IsolationConfigError("--isolation shim needs --shim-library PATH (`gpupool shim path` prints it)")
    if requested == AUTO:
        if shim_library:
            return BackendChoice(IsolationBackend.SHIM, f"auto: the interception library {shim_library}")
        return BackendChoice(IsolationBackend.NONE, "auto: no --shim-library given; shares are NOT enforced, "
                                                    "containers can use whole cards")
    backend = IsolationBackend(requested)
    if backend is IsolationBackend.NONE:
        return BackendChoice(backend, "--isolation none: shares are NOT enforced")
    return BackendChoice(backend, f"--isolation {backend}")


@dataclass(frozen=True)
class EnforcementState:
    """What a backend can say about itself now: its name, whether it is enforcing, and why not;
    with the kernel's ``dmem`` controller in use, its regions and limits too."""

    backend: IsolationBackend
    enforcing: bool
    detail: str = ""
    dmem: DmemReport | None = None


LivePods = Callable[[], Mapping[str, PodKey] | None]
"""Pod UID → (namespace, name) of the pods kubelet lists now; ``None`` while that is not known
(no PodResources answer yet, or a listed pod the agent cannot read), when nothing may be removed."""


class Enforcement(Protocol):
    """A backend as the node agent uses it."""

    def grant_extras(self, pod: PodView, container: str) -> GrantExtras:
        """Env and mounts for one container's grant: the same for every call with the same
        arguments, and without awaiting (Allocate must stay one atomic step of the event loop)."""
        ...

    def state(self) -> EnforcementState:
        """Whether this backend enforces the shares right now."""
        ...

    async def run(self, live_pods: LivePods) -> None:
        """Background work (serving, supervising, cleaning up) until cancelled."""
        ...


class NoEnforcement:
    """``--isolation none``: the grant is the environment contract alone."""

    def grant_extras(self, pod: PodView, container: str) -> GrantExtras:
        return GrantExtras()

    def state(self) -> EnforcementState:
        return EnforcementState(IsolationBackend.NONE, False, "no enforcement backend on this node")

    async def run(self, live_pods: LivePods) -> None:
        return None
