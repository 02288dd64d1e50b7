"""Domain types and ports of the node side: pods as the node agent sees them, and what it reads.

The node agent and the allocation mapper work on these frozen views; the Kubernetes adapters build
them from API objects and the kubelet's PodResources answers. Keeping them here (not in the
adapters) lets the services stay free of Kubernetes plumbing and lets tests feed them directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpupool.core.model import ContainerAssignment, Placement
from gpupool.core.units import MEMORY_UNIT_MIB

# The units of the advertised resources (what one kubelet "device" stands for): ``<domain>/gpu`` one
# whole card (ID ``g<i>``); ``<domain>/gpu-mem`` 256 MiB of card memory (``g<i>-m<k>``);
# ``<domain>/gpu-core`` 1 % of one card's compute (``g<i>-c<k>``); ``<domain>/gpu-shared`` one slice
# on a card (``g<i>-s<k>``); foreign aliases see :mod:`gpupool.nodeagent.device_layout`. A
# container's limit is what it takes on *each* of its cards (the extender's reading); kubelet's
# device counts are only its admission guard, the assignment says which cards. 8 x 141 GB cards
# give 4,512 memory devices, about 90 kB per ListAndWatch.
MEMORY_UNIT = MEMORY_UNIT_MIB
CORE_PER_CARD = 100


@dataclass(frozen=True)
class NodeAssignment:
    """The scheduler's decision for one pod, as decoded from ``<domain>/assignment-v1``.

    ``placement`` is the core's type (card = NVML index); ``uuids`` maps each index to the UUID the
    scheduler saw, so the node can refuse an assignment made for cards it no longer has.
    """

    placement: Placement
    uuids: Mapping[int, str]
    time: str = ""
    pod_uid: str = ""
    """The uid of the pod the extender decided for ("" from extenders before ``podUID``)."""

    def container(self, name: str) -> ContainerAssignment | None:
        """The slices of one container (init or app), or ``None`` when it holds no GPU."""
        for assignment in self.placement.containers:
            if assignment.container == name:
                return assignment
        return None


@dataclass(frozen=True)
class ContainerView:
    """One container of a pod: its name, whether it is an init container, its extended limits."""

    name: str
    init: bool
    limits: Mapping[str, int]
    restartable: bool = False
    """An init container with ``restartPolicy: Always`` (a native sidecar): kubelet allocates it in
    init-container order, keeps its devices for the pod's life (never reused by later containers)
    and PodResources lists it with them."""
    claims: tuple[str, ...] = ()
    """Names of the ResourceClaims (in the pod's namespace) the container uses: DRA grants it the
    claims' devices (``resources.claims`` resolved through the pod's ``resourceClaims`` and, for a
    claim made from a template, its ``status.resourceClaimStatuses``)."""

    @property
    def listed(self) -> bool:
        """Whether PodResources lists this container (app containers and native sidecars)."""
        return not self.init or self.restartable


@dataclass(frozen=True)
class PodView:
    """A pod bound to this node, reduced to what the node agent needs."""

    namespace: str
    name: str
    uid: str
    node: str
    created: float
    terminated: bool
    containers: tuple[ContainerView, ...]
    assignment: NodeAssignment | None = None
    assignment_error: str = ""
    allocated: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Container → resources already served, from ``allocated-v1`` (survives an agent restart)."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def admission_order(self) -> tuple[ContainerView, ...]:
        """Init containers, then app containers, each in spec order: kubelet's Allocate order."""
        return (*(c for c in self.containers if c.init), *(c for c in self.containers if not c.init))


PodResourcesSnapshot = Mapping[tuple[str, str], Mapping[str, Mapping[str, frozenset[str]]]]
"""kubelet's PodResources List: (namespace, name) → container → resource → device IDs. Lists
every active pod of kubelet's pod manager (admitted or being admitted; a rejected or finished pod
is not listed), its native sidecars (init containers with ``restartPolicy: Always``) and its app
containers; regular init containers are never listed (kubelet 1.35-1.37, docs/allocate-mapping.md)."""


class StartRefused(Exception):
    """The node agent refuses a container's start (the device plugin's PreStartContainer fails, and
    kubelet reports the message on the pod and retries with its back-off)."""


class PodSource(Protocol):
    """Pods bound to this node, from a watch cache or the API (tests: an in-memory fake)."""

    async def get(self, namespace: str, name: str) -> PodView | None:
        """The pod now (an API read when the cache lacks it); ``None`` when it does not exist."""
        ...

    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch annotations onto the pod."""
        ...


class PodResourcesReader(Protocol):
    """kubelet's PodResources API."""

    async def list(self) -> PodResourcesSnapshot:
        """One List call."""
        ...


@dataclass(frozen=True)
class DeviceSpec:
    """A device node to expose: host path, path in the container, cgroup permissions."""

    host_path: str
    container_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class Mount:
    """A host file or directory bind-mounted into the container."""

    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True)
class GrantExtras:
    """What the node's enforcement backend adds to a container's grant (the same for every resource
    of the container, so kubelet's merge of the responses stays exact)."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()


@dataclass(frozen=True)
class ContainerGrant:
    """What Allocate returns for one container: env vars, device nodes and mounts."""

    envs: Mapping[str, str]
    devices: tuple[DeviceSpec, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
