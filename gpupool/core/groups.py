"""Resource groups (seed 002): which cards a group's pods may use, and which group a pod goes to.

A group binds nodes and, per node, GPUs (by UUID; a node listed without GPUs brings all of its
cards). Its pods may use only its cards: the group becomes the :class:`CardScope` of their requests,
so every check of the card rule keeps them there. Groups may overlap (share GPUs) or not:

* an unshared group *reserves* its cards: pods outside every group listing a card never get it;
* a shared group only restricts its own pods: its cards stay open to pods without a group.

When a pod may go to several groups, the choice follows the seed: only groups holding cards of the
requested type (GPU model, physical or virtual) are candidates; of those where the pod fits now,
the one whose remainder minus the pod's demand is smallest wins (best fit at group level), ties by
name. Remainder and demand are measured in compute (per-mille of a card; a whole card 1000), or in
memory for a pod that asks for memory only (gpushare style).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from gpupool.core.card_rule import FIRST_BOOKING_VERDICT, CardVerdict, IntArray
from gpupool.core.card_scope import CardScope, CardSet
from gpupool.core.feasibility import card_verdicts, node_fit_mask
from gpupool.core.model import ContainerRequest, PodRequest
from gpupool.core.state import ClusterState


@dataclass(frozen=True)
class Group:
    """A resource group as the core sees it: its cards and whether it shares them."""

    name: str
    cards: CardSet
    shared: bool = False

    @cached_property
    def scope(self) -> CardScope:
        """The scope of the group's pods (one object per group, so caches keyed on it are hit)."""
        return CardScope(f"resource group {self.name}", (self.cards,))


def outside_scope(groups: Sequence[Group]) -> CardScope | None:
    """The scope of a pod without a group: every card but those reserved by unshared groups (None
    when no group reserves any)."""
    reserved = [g.cards for g in groups if not g.shared]
    if not reserved:
        return None
    nodes = frozenset().union(*(c.nodes for c in reserved))
    uuids = frozenset().union(*(c.uuids for c in reserved))
    return CardScope("cards no resource group reserves", avoid=CardSet(nodes, uuids))


def scoped(pod: PodRequest, scope: CardScope | None) -> PodRequest:
    """``pod`` with ``scope`` narrowed onto every GPU request (app and init containers)."""
    if scope is None:
        return pod

    def narrow(container: ContainerRequest) -> ContainerRequest:
        gpu = container.gpu
        if gpu is None:
            return container
        joined = scope if gpu.scope is None else gpu.scope.narrowed(scope)
        return dataclasses.replace(container, gpu=dataclasses.replace(gpu, scope=joined))

    return dataclasses.replace(pod, containers=tuple(map(narrow, pod.containers)),
                               init_containers=tuple(map(narrow, pod.init_containers)))


def scope_of(pod: PodRequest) -> CardScope | None:
    """The card scope of the pod's GPU requests (:func:`scoped` gives them all the same one)."""
    for container in (*pod.containers, *pod.init_containers):
        if container.gpu is not None:
            return container.gpu.scope
    return None


@dataclass(frozen=True)
class GroupChoice:
    """The group a pod goes to (None when none fits), and why each other candidate did not."""

    group: Group | None
    refused: dict[str, str]


def _measure(pod: PodRequest) -> str:
    gpu = next((c.gpu for c in pod.gpu_containers), None)
    memory_only = gpu is not None and not gpu.exclusive and gpu.compute == 0 and bool(gpu.memory_mib)
    return "memory" if memory_only else "compute"


def _demand(pod: PodRequest, measure: str) -> int:
    if measure == "compute":
        return pod.gpu_milli_total()
    return sum((c.gpu.memory_mib or 0) * c.gpu.count for c in pod.gpu_containers if c.gpu is not None)


def remainder(state: ClusterState, pod: PodRequest, rows: IntArray, measure: str = "compute") -> int:
    """Free compute (or memory) on the cards of ``rows`` that the pod's first GPU request may use
    (healthy, of its model, kind and scope) and that are not held whole."""
    gpu = next((c.gpu for c in (*pod.containers, *pod.init_containers) if c.gpu is not None), None)
    if gpu is None or not len(rows):
        return 0
    codes = card_verdicts(state, gpu, rows)
    usable = (codes == CardVerdict.FITS) | ((codes >= FIRST_BOOKING_VERDICT) & (codes != CardVerdict.EXCLUSIVE_HELD)
                                           & (codes != CardVerdict.NOT_IDLE))
    free = state.card_compute_free[rows] if measure == "compute" else state.card_mem_free[rows]
    return int(np.clip(free, 0, None)[usable].sum())


def group_rows(state: ClusterState, group: Group) -> IntArray:
    """Ledger rows of the present nodes that hold at least one card of the group."""
    rows: IntArray = np.flatnonzero(state.scope_reach(group.scope) & state.present).astype(np.int64)
    return rows


def choose_group(state: ClusterState, pod: PodRequest, groups: Sequence[Group]) -> GroupChoice:
    """The best-fitting group of ``groups`` for ``pod`` (see the module doc), with reasons for the rest."""
    if len(groups) == 1:
        return GroupChoice(groups[0], {})
    measure = _measure(pod)
    demand = _demand(pod, measure)
    refused: dict[str, str] = {}
    best: tuple[int, str, Group] | None = None
    for group in groups:
        inside = scoped(pod, group.scope)
        rows = group_rows(state, group)
        if not _has_type(state, inside, rows):
            refused[group.name] = f"resource group {group.name} has no GPU of the requested type"
            continue
        if not node_fit_mask(state, inside, rows).any():
            refused[group.name] = f"no node of resource group {group.name} can hold the pod now"
            continue
        left = remainder(state, inside, rows, measure) - demand
        if best is None or (left, group.name) < best[:2]:
            best = (left, group.name, group)
    return GroupChoice(None if best is None else best[2], refused)


def _has_type(state: ClusterState, pod: PodRequest, rows: IntArray) -> bool:
    """Whether the group's cards include one of the requested type: a healthy card the request's
    model, kind and scope accept, whatever it holds now."""
    if not len(rows):
        return False
    for container in (*pod.containers, *pod.init_containers):
        if container.gpu is not None:
            codes = card_verdicts(state, container.gpu, rows)
            if not ((codes == CardVerdict.FITS) | (codes >= FIRST_BOOKING_VERDICT)).any():
                return False
    return True
