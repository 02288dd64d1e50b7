"""Units of the core: compute in per-mille of a card, memory in MiB and its 256 MiB slicing unit."""

from __future__ import annotations

COMPUTE_PER_CARD = 1000
"""Compute of one card in per-mille. The API speaks percent; see :func:`percent_to_compute`."""

BYTES_PER_MIB = 1 << 20
"""Bytes in one MiB: exported series are in bytes (Prometheus's base unit), the core counts MiB."""

MEMORY_UNIT_MIB = 256
"""The Chengyun patent slices memory in 256 MiB units; requests may be written in them."""


def percent_to_compute(percent: int) -> int:
    """Convert an API compute request (percent of a card, 1..100) to core per-mille."""
    if not 0 <= percent <= 100:
        raise ValueError(f"compute must be a percentage of one card (0..100), got {percent}")
    return percent * (COMPUTE_PER_CARD // 100)

