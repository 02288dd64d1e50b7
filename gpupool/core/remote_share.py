"""Where a remote share goes: the pod's own node, else a GPU node behind its switch, else any.

A pod that asks for a remote share (``PodRequest.remote``) may run on a node without GPUs; its GPU
slice (or the same slice on ``count`` cards: ``gpu-shared: n``, or ``n`` whole cards) is booked on
cards of one GPU node and reached over the network, through one server and one connection. The order follows the
Chengyun patent's matching rules (seed 003, rules 61-68): a worker's own GPUs first (no network at
all), then GPU nodes that reach it without crossing a switch, then the rest. Within a tier the node
whose best fitting card is the tightest wins (best fit, then the node name, so the choice is
repeatable); on that node the cards are chosen by the core's card choice
(:func:`gpupool.core.cards.assign_on_node`), so the one card rule decides which cards may take the
slices, exactly as for a local pod of the same request, and the ledger books it as any other
placement. A node is a server only with ``count`` cards that take a slice now; cards of several
nodes are never combined (the seed's rules 62 and 67, left), nor is one card presented as several
devices for a remote share (rules 61 and 66: the virtual cards of
:mod:`gpupool.core.virtual_cards` are local only).

What the pod holds in the ledger: a local share is an ordinary placement on its node (CPU, memory
and the slice). A remote share is a placement on the *server* node with the slice only (no CPU or
memory: the pod runs elsewhere); the pod's CPU and memory on its own node are left to
kube-scheduler's own checks. Releasing the pod (deleted, finished) releases the slice; removing the
server node from the ledger drops the booking with it (:meth:`ClusterState.remove_node`).

Which nodes may run the pod: a node with room for its CPU and memory that either has a card for
the slice itself, or has no GPU at all while some GPU node has one. A GPU node whose cards cannot
take the slice is refused: its kubelet would hand the pod's gpupool resources to the node's device
plugin, which has no local card to grant.

Pure: reads the ledger, books nothing.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from gpupool.core.cards import SharedCardChooser, assign_on_node
from gpupool.core.feasibility import explain_cards, node_resources_problem, node_room_mask, request_fit
from gpupool.core.fragmentation import FloatArray
from gpupool.core.model import ContainerRequest, GpuRequest, NodeSpec, Placement, PodRequest
from gpupool.core.state import BoolArray, ClusterState, IntArray

SWITCH_LABEL = "gpupool.io/switch"
"""Node label naming the network switch (or any network domain) a node sits behind."""
ZONE_LABEL = "topology.kubernetes.io/zone"
"""The fallback when a node has no :data:`SWITCH_LABEL`: nodes of one zone count as one switch."""

SERVER_TRIES = 8
"""Server nodes (best first) on which the card choice is tried before the share is refused."""

NO_SERVER = "no GPU node of the cluster has a card that can hold the remote share now"
MAX_REMOTE_CARDS = 16
"""The most cards one remote share may ask for: the GPU server serves a client at most this many
devices (``REMOTE_MAX_DEVICES`` of the wire protocol; ``remote-share-v1`` holds as many)."""


def no_server(count: int) -> str:
    """Why no GPU node can hold a share of ``count`` cards now."""
    if count == 1:
        return NO_SERVER
    return (f"no GPU node of the cluster has {count} cards that can each hold a slice of the remote share now "
            "(a remote share's cards are all on one GPU node)")


class Tier(IntEnum):
    """How far the share is from the pod, best first."""

    LOCAL = 0
    """A card of the pod's own node: a plain local share."""
    SAME_SWITCH = 1
    """A GPU node with the same switch label (or zone) as the pod's node."""
    OTHER = 2
    """Any other GPU node."""


TIER_SCORES = {Tier.LOCAL: 2.0, Tier.SAME_SWITCH: 1.0, Tier.OTHER: 0.0}
"""The filter's raw score of a node by the best tier its pod could get (higher is better)."""


@dataclass(frozen=True)
class RemoteChoice:
    """The decision: the placement (on the pod's node for ``LOCAL``, else on the server) and its tier."""

    placement: Placement
    tier: Tier


def switch_of(spec: NodeSpec) -> str | None:
    """The node's switch: its :data:`SWITCH_LABEL`, else its :data:`ZONE_LABEL`, else None
    (a node without either shares a switch with no other)."""
    return spec.labels.get(SWITCH_LABEL) or spec.labels.get(ZONE_LABEL) or None


@dataclass(frozen=True)
class _Layout:
    """Per node row, for one node layout of the ledger: its switch as a small id (-1: none) and its
    rank in node-name order (the tie-break). Worked out once per layout, not on every decision."""

    version: int
    switch: IntArray
    name_rank: IntArray


_layouts: weakref.WeakKeyDictionary[ClusterState, _Layout] = weakref.WeakKeyDictionary()


def _layout(state: ClusterState) -> _Layout:
    known = _layouts.get(state)
    if known is not None and known.version == state.layout_version:
        return known
    ids: dict[str, int] = {}
    switch = np.array([-1 if (name := switch_of(spec)) is None else ids.setdefault(name, len(ids))
                       for spec in state.specs], dtype=np.int64)
    name_rank = np.empty(state.size, dtype=np.int64)
    name_rank[np.argsort(np.array([spec.name for spec in state.specs], dtype=object), kind="stable")] = (
        np.arange(state.size))
    known = _layouts[state] = _Layout(state.layout_version, switch, name_rank)
    return known


def remote_shape_problem(pod: PodRequest) -> str | None:
    """Why ``pod`` cannot take a remote share (None when it can): exactly one app container asks for
    GPUs (a slice with memory on 1 to :data:`MAX_REMOTE_CARDS` cards, or as many whole cards, not
    as virtual cards), and no init container does."""
    if any(c.gpu is not None for c in pod.init_containers):
        return "a remote share is for app containers only; an init container asks for GPUs"
    gpu = pod.gpu_containers
    if len(gpu) != 1:
        return f"a remote share is one container's; {len(gpu)} containers ask for GPUs"
    request = gpu[0].gpu
    if request is not None and not 1 <= request.count <= MAX_REMOTE_CARDS:
        return (f"a remote share is 1 to {MAX_REMOTE_CARDS} cards of one GPU node; container {gpu[0].name} asks for "
                f"{request.count}")
    if request is not None and request.virtual is not None and request.count > 1:
        return (f"a remote share has no virtual cards (one card presented as several devices); container "
                f"{gpu[0].name} asks for {request.count} of them")
    if request is not None and request.memory_mib == 0 and request.memory_share is None and not request.exclusive:
        return (f"a remote share needs GPU memory (the server books memory per client); container {gpu[0].name} "
                "asks for compute only")
    return None


def _share_request(pod: PodRequest) -> tuple[ContainerRequest, GpuRequest]:
    container = pod.gpu_containers[0]
    assert container.gpu is not None  # gpu_containers holds only containers with a request
    return container, container.gpu


def share_alone(pod: PodRequest) -> PodRequest:
    """The pod's GPU container alone, without CPU or memory: what a server node holds of it (and the
    request whose feasible nodes are the servers; the scheduler keeps those per shape)."""
    container, _ = _share_request(pod)
    return PodRequest(key=pod.key, containers=(dataclasses.replace(container, cpu_milli=0, memory_mib=0),),
                      priority=pod.priority, policy=pod.policy)


def _fitting_rows(state: ClusterState, request: GpuRequest,
                  servers: IntArray | None = None) -> tuple[IntArray, BoolArray]:
    """Present rows (of ``servers`` when given: rows known to fit, e.g. from the scheduler's shape
    cache) with ``request.count`` cards that take a slice now (the core's rule for a local pod of
    the same request), and their card masks."""
    rows = np.flatnonzero(state.present[:state.size]).astype(np.int64) if servers is None else servers
    has, fits = request_fit(state, request, rows)
    return rows[has], fits[has]


def client_scores(state: ClusterState, pod: PodRequest, rows: IntArray,
                  servers: IntArray | None = None) -> tuple[IntArray, FloatArray]:
    """The rows of ``rows`` that may run ``pod`` (see the module docstring) and their raw scores:
    :data:`TIER_SCORES` of the best tier the share would get from there. ``servers``: the rows
    that can hold :func:`share_alone` of the pod, when the caller knows them."""
    if remote_shape_problem(pod) is not None:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    if servers is None:
        _, request = _share_request(pod)
        servers, _ = _fitting_rows(state, request)
    if not len(servers):
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    rows = np.asarray(rows, dtype=np.int64)
    room = node_room_mask(state, pod, rows)
    is_server = np.zeros(state.size, dtype=bool)
    is_server[servers] = True
    own = is_server.take(rows)
    cardless = state.card_count.take(rows) == 0
    ok = room & (own | cardless)
    switch = _layout(state).switch
    served = np.unique(switch.take(servers))
    near = np.isin(switch.take(rows), served[served >= 0])
    scores = np.where(own, TIER_SCORES[Tier.LOCAL],
                      np.where(near, TIER_SCORES[Tier.SAME_SWITCH], TIER_SCORES[Tier.OTHER]))
    return rows[ok], scores[ok]


def client_problem(state: ClusterState, pod: PodRequest, row: int,
                   fitting: tuple[IntArray, BoolArray] | None = None) -> str | None:
    """Why node ``row`` may not run ``pod`` with a remote share, in words; None when it may.
    ``fitting``: :func:`_fitting_rows` of the pod's request when the caller has it."""
    problem = remote_shape_problem(pod) or node_resources_problem(state, row, pod)
    if problem is not None:
        return problem
    _, request = _share_request(pod)
    servers, _ = fitting or _fitting_rows(state, request)
    if (servers == row).any():
        return None
    if int(state.card_count[row]) > 0:
        local = explain_cards(state, row, request) or "its cards cannot hold the share"
        return (f"{local}; a node with GPUs runs a remote-share pod only on its own cards (its device "
                "plugin would be asked for them)")
    if len(servers):
        return None
    most = int(state.card_count[:state.size][state.present[:state.size]].max(initial=0))
    if request.count > most:
        return (f"a remote share of {request.count} cards needs one GPU node with that many; the largest GPU node "
                f"of the cluster has {most}")
    return no_server(request.count)


def server_order(state: ClusterState, pod: PodRequest, client_row: int, most: int | None = None,
                 fitting: tuple[IntArray, BoolArray] | None = None) -> list[tuple[int, Tier]]:
    """GPU nodes other than ``client_row`` with a card for the share, best first (at most ``most``):
    by tier, then the tightest fitting card (least free memory), then the node name."""
    _, request = _share_request(pod)
    servers, fits = fitting or _fitting_rows(state, request)
    others = servers != client_row
    servers, fits = servers[others], fits[others]
    layout = _layout(state)
    home = int(layout.switch[client_row])
    tiers = np.where((layout.switch.take(servers) == home) & (home >= 0), int(Tier.SAME_SWITCH), int(Tier.OTHER))
    free = np.where(fits, state.card_mem_free.take(servers, 0), np.iinfo(np.int64).max).min(axis=1)
    order = np.lexsort((layout.name_rank.take(servers), free, tiers))[:most]
    return [(int(servers[i]), Tier(int(tiers[i]))) for i in order]


def place_share(state: ClusterState, pod: PodRequest, client_row: int,
                chooser: SharedCardChooser | None = None, servers: IntArray | None = None) -> RemoteChoice | str:
    """Where the share of ``pod``, run on node ``client_row``, is booked, or why nowhere: the own
    node's cards first, then :func:`server_order`; nothing is booked. ``servers`` as for
    :func:`client_scores`."""
    shape = remote_shape_problem(pod)
    if shape is not None:
        return shape
    _, request = _share_request(pod)
    fitting = _fitting_rows(state, request, servers)
    problem = client_problem(state, pod, client_row, fitting)
    if problem is not None:
        return problem
    local = assign_on_node(state, client_row, pod, chooser) if int(state.card_count[client_row]) else None
    if isinstance(local, Placement):
        return RemoteChoice(local, Tier.LOCAL)
    alone = share_alone(pod)  # the pod's CPU and memory stay on its own node
    last = no_server(request.count)
    for row, tier in server_order(state, pod, client_row, SERVER_TRIES, fitting):
        result = assign_on_node(state, row, alone, chooser)
        if isinstance(result, Placement):
            return RemoteChoice(result, tier)
        last = result
    return last
