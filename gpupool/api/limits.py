"""The largest values gpupool accepts from the cluster, one definition for every reader and writer.

Why bounds at all: the ledger (:class:`gpupool.core.state.ClusterState`) keeps every quantity in
``int64`` arrays and sums, subtracts and (in the scoring policies) multiplies them, and the node
agent advertises one kubelet device per 256 MiB of card memory. A value outside these bounds is a
broken inventory, a hand edit or an attack, never a real machine: accepted, a 31-digit card memory
overflowed ``int64`` half-way through a node update, and a 10,000-card inventory would widen every
node's row of the ledger to 10,000 slots. So the annotation codecs (:mod:`gpupool.api.annotations`),
the Kubernetes translation and the node agent's inventory file all refuse values past these, with
the field named, before anything reaches the ledger.

Every bound here is at most the core model's own (:mod:`gpupool.core.model`, what the ledger can
hold; a test keeps it so), so a document these accept never fails in the core. Each bound is far
above today's hardware and small enough that the product of any two quantities
of the same kind still fits ``int64`` (2^31 x 2^31 < 2^63).
"""

from __future__ import annotations

from gpupool.core import model as core_model
from gpupool.core.units import COMPUTE_PER_CARD, MEMORY_UNIT_MIB

MAX_CARDS_PER_NODE = 64
"""Cards one node may publish. Today's largest: 8 cards with 7 MIG slices each (56 virtual cards);
HGX boards carry 8 or 16. The ledger's rows are as wide as the widest node, so this also bounds the
ledger's memory (5,000 nodes x 64 slots x 10 arrays x 8 bytes = 26 MB)."""

MAX_CARD_INDEX = core_model.MAX_CARDS_PER_NODE - 1
"""Largest card index: the core model's. NVML numbers cards 0..n-1; the room above 63 leaves sparse
numberings (a card taken out, virtual cards numbered by their parent) valid."""

MAX_CARD_MEMORY_MIB = 1 << 20
"""Memory of one card: 1 TiB, five times today's largest (192 GB). The node agent advertises
``MAX_CARD_MEMORY_MIB // MEMORY_UNIT_MIB`` = 4,096 memory devices for such a card."""

MAX_COMPUTE_PER_CARD = COMPUTE_PER_CARD
"""A card's compute is per-mille (1000 = the whole card); no slice holds more."""

MAX_NODE_CPU_MILLI = (1 << 31) - 1
"""Allocatable CPU of one node and the CPU of one container: about 2.1 million cores."""

MAX_NODE_MEMORY_MIB = (1 << 31) - 1
"""Allocatable memory of one node and the memory of one container: 2 PiB."""

MAX_DEVICES_PER_RESOURCE = MAX_CARDS_PER_NODE * (MAX_CARD_MEMORY_MIB // MEMORY_UNIT_MIB + 100)
"""Kubelet devices of one resource a container can hold: the node agent's largest per-card count
(``gpu-shared``: one per 256 MiB plus one per percent) on every card of the largest node."""

MAX_TEXT_CHARS = 512
"""Length of every name and identifier in the documents: node and container names (at most 253),
qualified resource names (at most 317), NVML uuids (at most 80) and product names (at most 96)."""


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be a name or identifier (empty, too long, control characters), or None.

    Names end up in log lines, Prometheus labels, events and the kubelet's device IDs; a newline or
    an escape sequence there forges log lines or breaks the exposition format.
    """
    if not value:
        return "must be non-empty"
    if len(value) > MAX_TEXT_CHARS:
        return f"at most {MAX_TEXT_CHARS} characters, got {len(value)}"
    if not value.isprintable():
        bad = next(ch for ch in value if not ch.isprintable())
        return f"must not contain control or separator characters (found {bad!r})"
    return None
