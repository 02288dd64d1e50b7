"""A node description checked against the ledger's array types, before the ledger is written.

Checking first is what makes a node update all-or-nothing (:meth:`ClusterState.upsert_node`): a
number that does not fit the arrays' dtype raises here, while the ledger is still untouched, and
the write that follows cannot fail half-way.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gpupool.core.model import GpuKind, NodeSpec

_INT64 = np.iinfo(np.int64)
INT64_MIN, INT64_MAX = int(_INT64.min), int(_INT64.max)


@dataclass(frozen=True)
class NodeRow:
    """One node's row of the ledger: its totals and its cards' columns, ready to be written."""

    spec: NodeSpec
    cpu_milli: int
    memory_mib: int
    healthy: tuple[bool, ...]
    virtual: tuple[bool, ...]
    models: tuple[str, ...]
    card_memory_mib: tuple[int, ...]
    card_compute: tuple[int, ...]

    @property
    def card_count(self) -> int:
        return len(self.models)

    @staticmethod
    def of(spec: NodeSpec) -> NodeRow:
        """Check every number of ``spec`` against int64; ``ValueError`` names the node and the field."""
        cards = spec.cards
        return NodeRow(
            spec=spec,
            cpu_milli=_int64s(spec, "cpuMilli", (spec.cpu_milli,))[0],
            memory_mib=_int64s(spec, "memoryMiB", (spec.memory_mib,))[0],
            healthy=tuple(bool(c.healthy) for c in cards),
            virtual=tuple(c.kind == GpuKind.VIRTUAL for c in cards),
            models=tuple(c.model for c in cards),
            card_memory_mib=_int64s(spec, "cards.memoryMiB", (c.memory_mib for c in cards)),
            card_compute=_int64s(spec, "cards.compute", (c.compute for c in cards)),
        )


def _int64s(spec: NodeSpec, field: str, values: Iterable[object]) -> tuple[int, ...]:
    """``values`` as ints that fit the ledger's int64 arrays, or ``ValueError`` naming node and field."""
    checked: list[int] = []
    for value in values:
        if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise ValueError(f"node {spec.name}: {field} does not fit the ledger: not an integer")
        number = int(value)
        if not INT64_MIN <= number <= INT64_MAX:
            raise ValueError(f"node {spec.name}: {field} does not fit the ledger: "
                             f"{number.bit_length()} bits, the ledger holds 64")
        checked.append(number)
    return tuple(checked)
