"""A node description converted to the ledger's array types, before the ledger is written.

Converting first is what makes a node update all-or-nothing (:meth:`ClusterState.upsert_node`): a
number that does not fit the arrays' dtype raises here, while the ledger is still untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.card_rule import BoolArray, IntArray
from gpupool.core.model import GpuKind, NodeSpec


@dataclass(frozen=True)
class NodeRow:
    """One node's row of the ledger: its totals and its cards' columns, ready to be written."""

    spec: NodeSpec
    cpu_milli: np.int64
    memory_mib: np.int64
    card_count: int
    healthy: BoolArray
    virtual: BoolArray
    models: tuple[str, ...]
    card_memory_mib: IntArray
    card_compute: IntArray

    @staticmethod
    def of(spec: NodeSpec) -> NodeRow:
        cards = spec.cards
        return NodeRow(
            spec=spec,
            cpu_milli=_int64(spec, "cpuMilli", [spec.cpu_milli])[0],
            memory_mib=_int64(spec, "memoryMiB", [spec.memory_mib])[0],
            card_count=len(cards),
            healthy=np.array([c.healthy for c in cards], dtype=bool),
            virtual=np.array([c.kind == GpuKind.VIRTUAL for c in cards], dtype=bool),
            models=tuple(c.model for c in cards),
            card_memory_mib=_int64(spec, "cards.memoryMiB", [c.memory_mib for c in cards]),
            card_compute=_int64(spec, "cards.compute", [c.compute for c in cards]),
        )


def _int64(spec: NodeSpec, field: str, values: list[int]) -> IntArray:
    """``values`` as the ledger's integers, or ``ValueError`` naming the node and the field."""
    try:
        return np.array(values, dtype=np.int64)
    except (OverflowError, TypeError, ValueError) as exc:
        raise ValueError(f"node {spec.name}: {field} does not fit the ledger ({values}): {exc}") from exc
