"""The resource model: cards, nodes, requests and placements.

Every type here is a frozen data class so that the simulator, the extender and the device plugin can
pass them around (and cache them) without defensive copies. Units are fixed once, here:

* memory in MiB (requests may also be written in 256 MiB units, see :mod:`gpupool.core.units`);
* compute in per-mille of one card (``COMPUTE_PER_CARD`` = 1000). The user-facing API speaks percent
  (100 per card, as in the Chengyun patent); the core keeps per-mille so that the trace's milli-GPU
  requests are represented exactly.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from functools import cached_property
from types import MappingProxyType

from gpupool.core.card_scope import CardScope
from gpupool.core.pod_policy import PolicyChoice
from gpupool.core.units import COMPUTE_PER_CARD

MAX_CARD_MEMORY_MIB = 2**31
"""Most memory one card (or one slice of it) may have: 2 PiB, thousands of times today's largest card.
The ledger keeps amounts as int64; with this bound and :data:`MAX_CARDS_PER_NODE` no sum over a
cluster of a million nodes can overflow, so a typo in an inventory is refused here, not mid-update."""

MAX_CARDS_PER_NODE = 256
"""Most cards one node may publish (the ledger's arrays are nodes x the widest node's cards)."""

MAX_NODE_CPU_MILLI = 2**40
"""Most allocatable CPU of one node, in milli-cores (about 10^9 cores)."""

MAX_NODE_MEMORY_MIB = 2**40
"""Most allocatable memory of one node, in MiB (1 EiB)."""

_SHOWN_DIGITS = 20
"""Numbers longer than this are described by their size in errors, not printed (Python refuses to
print ints of more than 4,300 digits, and a message should stay readable)."""


def check_bounds(owner: str, name: str, value: object, maximum: int) -> None:
    """Raise ``ValueError`` naming ``owner`` and field ``name`` unless ``value`` is an int in 0..maximum."""
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise ValueError(f"{owner}: {name} must be an integer, got {type(value).__name__}")
    number = int(value)
    if number < 0:
        raise ValueError(f"{owner}: {name} must be non-negative, got {_shown(number)}")
    if number > maximum:
        raise ValueError(f"{owner}: {name} must be at most {maximum}, got {_shown(number)}")


def _shown(number: int) -> str:
    if abs(number) < 10**_SHOWN_DIGITS:
        return str(number)
    return f"a number of {number.bit_length()} bits"


class GpuKind(StrEnum):
    """Whether a card is a physical device or a virtual GPU (vGPU/MIG slice) exposed as one."""

    PHYSICAL = "physical"
    VIRTUAL = "virtual"


class VirtualCards(StrEnum):
    """How a multi-card slice request may be served by one card presented as n devices (seed 003,
    rules 61-68): ``shared`` leaves the card's rest to other slices, ``exclusive`` closes the card
    (the container holds all of it, split into n devices)."""

    SHARED = "shared"
    EXCLUSIVE = "exclusive"


MAX_VIRTUAL_DEVICES = 16
"""Most devices one card is presented as to one container (a virtual-card request's ``count``)."""


class CardMode(IntEnum):
    """How a card is currently used; the exclusive/shared rules of the Chengyun patent.

    An ``IDLE`` card can take either kind of request. Once a whole-card request lands on it the card
    is ``EXCLUSIVE`` and closed to sharing; once a slice lands on it the card is ``SHARED`` and only
    takes further slices until it is empty again.
    """

    IDLE = 0
    SHARED = 1
    EXCLUSIVE = 2


class LinkLevel(IntEnum):
    """Communication cost between two cards; lower is better.

    The levels follow ``nvidia-smi topo -m`` (and NVML's common-ancestor levels), so the real backend
    can fill them in directly: same board/NVLink, one PCIe switch, several switches, the host bridge,
    the NUMA node, across sockets.
    """

    SELF = 0
    NVLINK = 1
    PCIE_SWITCH = 2
    MULTI_SWITCH = 3
    HOST_BRIDGE = 4
    NUMA_NODE = 5
    SYSTEM = 6


@dataclass(frozen=True)
class GpuCard:
    """One card of a node, as the node side discovers it.

    A virtual card (a MIG instance) has its own memory, a ``compute`` of less than a whole card
    (per-mille of its parent, in proportion to its compute slices), the name of its ``profile``
    (``3g.40gb``) and its ``parent`` card's UUID; both texts are empty for a physical card.
    """

    index: int
    uuid: str
    model: str
    memory_mib: int
    compute: int = COMPUTE_PER_CARD
    kind: GpuKind = GpuKind.PHYSICAL
    healthy: bool = True
    profile: str = ""
    parent: str = ""

    def __post_init__(self) -> None:
        check_bounds("card", "index", self.index, MAX_CARDS_PER_NODE - 1)
        owner = f"card {self.index}"
        check_bounds(owner, "memory_mib", self.memory_mib, MAX_CARD_MEMORY_MIB)
        check_bounds(owner, "compute", self.compute, COMPUTE_PER_CARD)


@dataclass(frozen=True)
class Topology:
    """Link levels between the cards of one machine (a symmetric matrix, diagonal ``SELF``).

    The Tencent GPUManager view of a machine is a tree (machine → sockets → host bridges → switches
    → cards); the level of the lowest common ancestor of two cards is their link level. NVLink pairs
    do not fit a tree, so the core keeps the matrix and offers :meth:`from_tree` to build it from one.
    """

    levels: tuple[tuple[LinkLevel, ...], ...] = ()

    @staticmethod
    def flat(card_count: int, level: LinkLevel = LinkLevel.SYSTEM) -> Topology:
        """All cards equally far apart: what we assume when a node publishes no topology."""
        return Topology(
            tuple(
                tuple(LinkLevel.SELF if i == j else level for j in range(card_count))
                for i in range(card_count)
            )
        )

    @staticmethod
    def from_tree(groups: list[list[int]] | list[list[list[int]]], card_count: int) -> Topology:
        """Build the matrix from nested groups of card indices.

        ``[[0, 1], [2, 3]]`` means cards 0/1 share a PCIe switch, 2/3 another, and the two switches
        meet at the host bridge. A third nesting level (``[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]``)
        adds sockets: the outer groups meet only at ``SYSTEM`` level.
        """
        levels = [[LinkLevel.SYSTEM] * card_count for _ in range(card_count)]
        for i in range(card_count):
            levels[i][i] = LinkLevel.SELF

        def leaves(group: object) -> list[int]:
            if isinstance(group, int):
                return [group]
            assert isinstance(group, list)
            return [card for item in group for card in leaves(item)]

        def mark(group: object, depth_level: LinkLevel) -> None:
            if not isinstance(group, list):
                return
            members = leaves(group)
            for a in members:
                for b in members:
                    if a != b and depth_level < levels[a][b]:
                        levels[a][b] = depth_level

        nested = any(isinstance(g, list) and any(isinstance(x, list) for x in g) for g in groups)
        for outer in groups:
            if nested:
                mark(outer, LinkLevel.HOST_BRIDGE)
                assert isinstance(outer, list)
                for inner in outer:
                    mark(inner, LinkLevel.PCIE_SWITCH)
            else:
                mark(outer, LinkLevel.PCIE_SWITCH)
        if not nested:
            # Groups of one machine without sockets meet at the host bridge.
            for a in range(card_count):
                for b in range(card_count):
                    if a != b and levels[a][b] == LinkLevel.SYSTEM:
                        levels[a][b] = LinkLevel.HOST_BRIDGE
        return Topology(tuple(tuple(row) for row in levels))

    def link(self, a: int, b: int) -> LinkLevel:
        """Link level between cards ``a`` and ``b`` (``SYSTEM`` when unknown)."""
        if a == b:
            return LinkLevel.SELF
        if a < len(self.levels) and b < len(self.levels[a]):
            return self.levels[a][b]
        return LinkLevel.SYSTEM


@dataclass(frozen=True)
class NodeSpec:
    """A machine: its allocatable CPU and memory, labels, cards and their topology."""

    name: str
    cpu_milli: int
    memory_mib: int
    cards: tuple[GpuCard, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    topology: Topology | None = None

    def __post_init__(self) -> None:
        owner = f"node {self.name}"
        check_bounds(owner, "cpu_milli", self.cpu_milli, MAX_NODE_CPU_MILLI)
        check_bounds(owner, "memory_mib", self.memory_mib, MAX_NODE_MEMORY_MIB)
        if len(self.cards) > MAX_CARDS_PER_NODE:
            raise ValueError(f"{owner}: cards: {len(self.cards)} cards, at most {MAX_CARDS_PER_NODE}")

    def link(self, a: int, b: int) -> LinkLevel:
        """Link level between two card positions of this node."""
        if self.topology is None:
            return LinkLevel.SELF if a == b else LinkLevel.SYSTEM
        return self.topology.link(a, b)


@dataclass(frozen=True)
class GpuRequest:
    """What one container asks of the GPUs, per card.

    * ``exclusive`` with ``count`` = n: n whole cards, fully free, closed to sharing afterwards.
    * otherwise a slice of ``count`` cards (usually 1), each giving ``compute`` per-mille and
      ``memory_mib``. ``memory_mib=None`` means "proportional to compute": a 0.3-GPU request gets 30 %
      of the chosen card's memory, which is the meaning of the trace's milli-GPU requests.
    * ``models``: allowed GPU models (empty = any); ``kind``: physical or virtual only (None = any);
      ``scope``: the cards it may use at all (group, pins, avoided cards/models; None = any).
    * ``memory_share``: per-mille of the chosen card's memory whatever the compute (HAMi's percentage).
    * ``virtual``: a slice of ``count`` >= 2 cards that may instead be served by ONE card holding all
      ``count`` slices, presented to the container as ``count`` devices (:mod:`gpupool.core.virtual_cards`).
    """

    count: int = 1
    compute: int = 0
    memory_mib: int | None = 0
    exclusive: bool = False
    models: frozenset[str] = frozenset()
    kind: GpuKind | None = None
    memory_share: int | None = None
    scope: CardScope | None = None
    virtual: VirtualCards | None = None

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError("a GPU request needs at least one card")
        if self.virtual is not None and (self.exclusive or not 2 <= self.count <= MAX_VIRTUAL_DEVICES):
            raise ValueError("virtual cards serve a slice of 2.."
                             f"{MAX_VIRTUAL_DEVICES} cards (not whole cards) from one card")
        if not 0 <= self.compute <= COMPUTE_PER_CARD:
            raise ValueError(f"compute per card must be within 0..{COMPUTE_PER_CARD} per-mille")
        if self.memory_mib is not None and not 0 <= self.memory_mib <= MAX_CARD_MEMORY_MIB:
            raise ValueError("memory per card must be non-negative" if self.memory_mib < 0 else
                             f"memory per card must be at most {MAX_CARD_MEMORY_MIB} MiB (the largest card "
                             f"gpupool accepts), got {_shown(self.memory_mib)}")
        if self.memory_share is not None and (not 0 < self.memory_share <= 1000 or self.memory_mib != 0):
            raise ValueError("a memory share is 1..1000 per-mille of a card, with memory_mib 0")
        if not self.exclusive and self.compute == 0 and not self.memory_mib and self.memory_share is None:
            raise ValueError("a shared GPU request must ask for memory, compute or both")

    @staticmethod
    def whole(count: int = 1, models: frozenset[str] = frozenset()) -> GpuRequest:
        """``count`` whole cards in exclusive mode."""
        return GpuRequest(count=count, compute=COMPUTE_PER_CARD, memory_mib=None, exclusive=True,
                          models=models)

    @staticmethod
    def fraction(milli: int, count: int = 1, models: frozenset[str] = frozenset()) -> GpuRequest:
        """The trace's form: ``milli`` thousandths of a card, memory proportional.

        1000 milli is a whole card and therefore exclusive, as in the Chengyun rules.
        """
        if milli >= COMPUTE_PER_CARD:
            return GpuRequest.whole(count, models)
        return GpuRequest(count=count, compute=milli, memory_mib=None, models=models)

    def memory_on(self, card: GpuCard) -> int:
        """Memory this request takes on ``card`` in MiB."""
        if self.exclusive:
            return card.memory_mib
        if self.memory_share is not None:
            return card.memory_mib * self.memory_share // COMPUTE_PER_CARD
        if self.memory_mib is None or self.memory_share is not None:
            # Floor, so that slices whose shares sum to a whole card never exceed its memory.
            share = self.compute if self.memory_share is None else self.memory_share
            return card.memory_mib * share // COMPUTE_PER_CARD
        return self.memory_mib

    def compute_on(self, card: GpuCard) -> int:
        """Compute this request takes on ``card`` in per-mille."""
        return card.compute if self.exclusive else self.compute

    def allows(self, card: GpuCard) -> bool:
        """Whether the card's model and kind are acceptable (health is the state's business)."""
        if self.models and card.model not in self.models:
            return False
        return self.kind is None or card.kind == self.kind


@dataclass(frozen=True)
class ContainerRequest:
    """One container: its CPU and memory, and optionally its GPU request."""

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu: GpuRequest | None = None


@dataclass(frozen=True)
class PodRequest:
    """A pod as the core sees it.

    Init containers run one after another before the app containers, so a pod needs
    max(largest init container, sum of app containers) of CPU and memory (the Kubernetes rule). GPU
    slices of init containers are given back before the app containers start; the core therefore
    places init-container GPU requests on the same cards as the app containers where possible and
    accounts the maximum, never the sum.
    """

    key: str
    containers: tuple[ContainerRequest, ...]
    init_containers: tuple[ContainerRequest, ...] = ()
    priority: int = 0
    policy: PolicyChoice | None = None
    """The pod's own node/card policy (None: the scheduler's)."""
    remote: bool = False
    """Its one GPU slice may be booked on another node's card (:mod:`gpupool.core.remote_share`)."""

    # The derived totals below are cached: the scheduler reads them several times per decision, and
    # the request is immutable (cached values live outside the fields, so equality and hashing are
    # unchanged).
    @cached_property
    def cpu_milli(self) -> int:
        app = sum(c.cpu_milli for c in self.containers)
        return max([app, *(c.cpu_milli for c in self.init_containers)])

    @cached_property
    def memory_mib(self) -> int:
        app = sum(c.memory_mib for c in self.containers)
        return max([app, *(c.memory_mib for c in self.init_containers)])

    @cached_property
    def gpu_containers(self) -> tuple[ContainerRequest, ...]:
        """App containers that ask for GPUs, in spec order."""
        return tuple(c for c in self.containers if c.gpu is not None)

    @property
    def wants_gpu(self) -> bool:
        return any(c.gpu is not None for c in (*self.containers, *self.init_containers))

    @property
    def wants_share(self) -> bool:
        """Whether some container asks for part of a card (a slice), not whole exclusive cards: a
        node that cannot enforce shares takes only whole cards."""
        return any(c.gpu is not None and not c.gpu.exclusive for c in (*self.containers, *self.init_containers))

    def gpu_milli_total(self) -> int:
        """Requested compute over all app containers in per-mille of a card (the trace's metric)."""
        return sum((COMPUTE_PER_CARD if c.gpu.exclusive else c.gpu.compute) * c.gpu.count
                   for c in self.gpu_containers if c.gpu is not None)


@dataclass(frozen=True)
class CardSlice:
    """What one container holds on one card."""

    card: int
    memory_mib: int
    compute: int
    exclusive: bool = False
    devices: int = 1
    """How many devices the card is presented as to the container (a virtual card, more than 1: the
    memory and compute above are the total, split evenly between the devices)."""


@dataclass(frozen=True)
class ContainerAssignment:
    """The slices one container holds; ``cards`` in the order they are exposed to it."""

    container: str
    slices: tuple[CardSlice, ...]
    init: bool = False

    @property
    def cards(self) -> tuple[int, ...]:
        return tuple(s.card for s in self.slices)


@dataclass(frozen=True)
class Placement:
    """The full decision for one pod: the node and every container's slices."""

    pod_key: str
    node: str
    cpu_milli: int
    memory_mib: int
    containers: tuple[ContainerAssignment, ...] = ()
    borrowed_from: str | None = None
    """Owner (``ns/name``) of the lent cards it borrows: booked on their loans (core/lent.py)."""

    def held_per_card(self) -> Mapping[int, tuple[int, int, bool]]:
        """Memory, compute and exclusivity held per card (read-only, worked out once: each booking reads
        it). App containers add up; init containers run first, so a card holds the larger of the two."""
        return self._held

    @cached_property
    def _held(self) -> Mapping[int, tuple[int, int, bool]]:
        app: dict[int, list[int]] = {}
        exclusive: set[int] = set()
        for assignment in sorted(self.containers, key=lambda a: a.init):  # app containers first
            for s in assignment.slices:
                acc = app.setdefault(s.card, [0, 0])
                if assignment.init:
                    acc[0], acc[1] = max(acc[0], s.memory_mib), max(acc[1], s.compute)
                else:
                    acc[0], acc[1] = acc[0] + s.memory_mib, acc[1] + s.compute
                if s.exclusive:
                    exclusive.add(s.card)
        return MappingProxyType({card: (m, c, card in exclusive) for card, (m, c) in app.items()})
