"""Small builders for hand-made clusters, pods and placements, shared by the core tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import (
    CardSlice,
    ContainerAssignment,
    ContainerRequest,
    GpuCard,
    GpuKind,
    GpuRequest,
    NodeSpec,
    Placement,
    PodRequest,
    Topology,
)
from gpupool.core.policies.base import PlacementPolicy, PodShape
from gpupool.core.state import BoolArray, ClusterState, IntArray

CARD_MIB = 16_384


def make_node(name: str, cards: int | Sequence[int] = 2, *, model: str = "A", cpu: int = 64_000,
              memory: int = 256_000, kind: GpuKind = GpuKind.PHYSICAL,
              topology: Topology | None = None, unhealthy: Iterable[int] = ()) -> NodeSpec:
    """A node with ``cards`` cards (a count of ``CARD_MIB`` cards, or a list of card memories)."""
    sizes = [CARD_MIB] * cards if isinstance(cards, int) else list(cards)
    bad = set(unhealthy)
    return NodeSpec(
        name=name,
        cpu_milli=cpu,
        memory_mib=memory,
        cards=tuple(GpuCard(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=m, kind=kind,
                            healthy=i not in bad)
                    for i, m in enumerate(sizes)),
        topology=topology,
    )


def pod_with(key: str, gpu: GpuRequest | None, *, cpu: int = 1_000, memory: int = 1_024) -> PodRequest:
    """A one-container pod."""
    return PodRequest(key=key, containers=(ContainerRequest("main", cpu_milli=cpu, memory_mib=memory,
                                                            gpu=gpu),))


def slice_pod(key: str, milli: int, *, count: int = 1, cpu: int = 1_000, memory: int = 1_024,
              models: Iterable[str] = ()) -> PodRequest:
    """A trace-style pod: ``milli`` of ``count`` cards, memory proportional (1000 = whole card)."""
    return pod_with(key, GpuRequest.fraction(milli, count, frozenset(models)), cpu=cpu, memory=memory)


def mem_pod(key: str, gpu_mib: int, *, compute: int = 0, cpu: int = 1_000) -> PodRequest:
    """An Alibaba-gpushare-style pod: a fixed amount of card memory (compute optional)."""
    return pod_with(key, GpuRequest(compute=compute, memory_mib=gpu_mib), cpu=cpu)


def cpu_pod(key: str, cpu: int = 1_000, memory: int = 1_024) -> PodRequest:
    """A pod without GPUs."""
    return pod_with(key, None, cpu=cpu, memory=memory)


def raw_placement(key: str, node: str, slices: Sequence[CardSlice], *, cpu: int = 0,
                  memory: int = 0) -> Placement:
    """A one-container placement with the given slices (bypasses the card chooser)."""
    return Placement(pod_key=key, node=node, cpu_milli=cpu, memory_mib=memory,
                     containers=(ContainerAssignment("main", tuple(slices)),))


def book_slice(state: ClusterState, key: str, node: str, card: int, *, compute: int = 0,
               memory: int = 0, cpu: int = 0) -> Placement:
    """Book a slice directly into the ledger (to set up a used card)."""
    placement = raw_placement(key, node, [CardSlice(card, memory, compute)], cpu=cpu)
    state.apply(placement)
    return placement


def book_whole(state: ClusterState, key: str, node: str, card: int) -> Placement:
    """Book one card exclusively."""
    row = state.index[node]
    slc = CardSlice(card, int(state.card_mem_total[row, card]), int(state.card_compute_total[row, card]),
                    exclusive=True)
    placement = raw_placement(key, node, [slc])
    state.apply(placement)
    return placement


def rows(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def ledger_snapshot(state: ClusterState) -> dict[str, np.ndarray]:
    """Copies of every array the ledger books into (to compare states exactly)."""
    names = ("cpu_free", "mem_free", "card_mem_free", "card_compute_free", "card_mode", "card_holders")
    return {n: getattr(state, n).copy() for n in names}


class CountingPolicy(PlacementPolicy):
    """Another policy's scores, counting the rows it is asked to score."""

    name = "counting"

    def __init__(self, inner: PlacementPolicy) -> None:
        super().__init__()
        self.inner = inner
        self.rows_scored = 0

    def prepare(self, state: ClusterState, profile: WorkloadProfile | None) -> None:
        super().prepare(state, profile)
        self.inner.prepare(state, profile)

    def node_score(self, state: ClusterState, shape: PodShape, rows: IntArray, fits: BoolArray) -> np.ndarray:
        self.rows_scored += len(rows)
        return self.inner.node_score(state, shape, rows, fits)
