"""Which backend enforces the shares on this node, and the port every backend implements.

One backend per node (``gpupool node-agent --isolation``):

* ``shim``: the interception library, preloaded into every process of a container with a share
  (needs ``--shim-library``);
* ``mps``: NVIDIA's MPS control daemon, run by the agent; the CUDA driver in each client applies
  the pinned-memory and active-thread limits the environment contract already carries;
* ``none``: the limits are only written into the environment; nothing holds a container to them;
* ``auto`` (the default) is a request, not a backend: ``shim`` with ``--shim-library`` when given,
  else with the library packaged with gpupool (the image ships it, so enforcement is on by
  default); with neither, the node cannot enforce and takes **no shares** (whole cards only) and
  says so on the Node (:mod:`gpupool.api.enforcement`). MPS is never chosen implicitly: it changes
  how every CUDA process on the node reaches its cards, which an admin should decide.

Only an explicit ``--isolation none`` advertises shares that nothing enforces: the admin's choice,
shown as such in ``kubectl gpupool inspect``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from gpupool.api.enforcement import EnforcementNotice
from gpupool.nodeagent.isolation.dmem_limits import DmemReport
from gpupool.nodeagent.types import GrantExtras, PodView
from gpupool.shim.build import PACKAGED_LIBRARY

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
    """The backend chosen and why (logged at start, published on the Node).

    ``library``: the interception library the shim backend mounts (None for the others).
    ``shares``: whether the node advertises GPU shares at all; false only where ``auto`` found
    nothing to enforce them with.
    """

    backend: IsolationBackend
    reason: str
    library: str | None = None
    shares: bool = True


def choose_backend(requested: str, shim_library: str | None, packaged: str | None = None,
                   unloadable: str = "") -> BackendChoice:
    """The backend for ``--isolation requested``; an impossible request is an error, not a fallback.

    ``packaged``: the interception library installed with gpupool, when there is one (``auto``
    uses it when no ``--shim-library`` is given; :func:`packaged_library` finds it).
    ``unloadable``: why the dynamic loader cannot load that library on this node ("" when it can,
    or when not probed; the start-up check "enforcement" finds it). Such a library enforces nothing
    (the loader skips a preload it cannot load), so the node is one without enforcement: whole
    cards only, as ``auto`` without a library. Only ``--isolation none`` shares cards unenforced.
    """
    if requested not in CHOICES:
        raise IsolationConfigError(f"--isolation {requested!r}: expected one of {', '.join(CHOICES)}")
    library = shim_library or packaged
    if requested == IsolationBackend.SHIM and not library:
        raise IsolationConfigError("--isolation shim needs --shim-library PATH (`gpupool shim path` prints it)")
    if unloadable and library and requested in (AUTO, IsolationBackend.SHIM):
        return BackendChoice(IsolationBackend.NONE, f"{requested}: the interception library {library} cannot be "
                                                    f"loaded ({unloadable}); whole cards only: give --shim-library "
                                                    "a library built for this node, --isolation mps, or "
                                                    "--isolation none to share cards unenforced", shares=False)
    if requested == AUTO:
        if shim_library:
            return BackendChoice(IsolationBackend.SHIM, f"auto: the interception library {shim_library}", shim_library)
        if packaged:
            return BackendChoice(IsolationBackend.SHIM, f"auto: the packaged interception library {packaged}", packaged)
        return BackendChoice(IsolationBackend.NONE, "auto: no interception library (no --shim-library, none "
                                                    "packaged); whole cards only: start the agent with "
                                                    "--shim-library, --isolation mps, or --isolation none to "
                                                    "share cards unenforced", shares=False)
    backend = IsolationBackend(requested)
    if backend is IsolationBackend.NONE:
        return BackendChoice(backend, "--isolation none: the admin's choice, shares are NOT enforced")
    if backend is IsolationBackend.SHIM:
        return BackendChoice(backend, f"--isolation shim: the interception library {library}", library)
    return BackendChoice(backend, f"--isolation {backend}")


def packaged_library() -> str | None:
    """The interception library installed with gpupool (the image's), or None where there is none.

    Never builds one: an agent must not start a compiler on a node."""
    return str(PACKAGED_LIBRARY) if PACKAGED_LIBRARY.is_file() else None


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
    """``--isolation none`` (or ``auto`` with nothing to enforce with): the grant is the environment
    contract alone. ``detail``: why, as the backend choice said it."""

    def __init__(self, detail: str = "no enforcement backend on this node") -> None:
        self.detail = detail

    def grant_extras(self, pod: PodView, container: str) -> GrantExtras:
        return GrantExtras()

    def state(self) -> EnforcementState:
        return EnforcementState(IsolationBackend.NONE, False, self.detail)

    async def run(self, live_pods: LivePods) -> None:
        return None


def enforcement_notice(choice: BackendChoice, enforcement: Enforcement) -> EnforcementNotice:
    """What the node publishes about its shares (:mod:`gpupool.api.enforcement`): the backend as it
    is now, and whether the node takes shares at all."""
    state = enforcement.state()
    return EnforcementNotice(state.backend.value, state.enforcing, choice.shares,
                             choice.reason if state.enforcing else (state.detail or choice.reason))
