"""Units and their parsing: the one place where user quantities become core integers."""

from __future__ import annotations

COMPUTE_PER_CARD = 1000
"""Compute of one card in per-mille. The API speaks percent; see :func:`percent_to_compute`."""

MEMORY_UNIT_MIB = 256
"""The Chengyun patent slices memory in 256 MiB units; requests may be written in them."""


def percent_to_compute(percent: int) -> int:
    """Convert an API compute request (percent of a card, 1..100) to core per-mille."""
    if not 0 <= percent <= 100:
        raise ValueError(f"compute must be a percentage of one card (0..100), got {percent}")
    return percent * (COMPUTE_PER_CARD // 100)


def parse_memory_mib(text: str | int) -> int:
    """Parse a memory quantity into MiB.

    Accepted: a bare integer (MiB), ``"4096Mi"``, ``"16Gi"``, and ``"16u"`` for 16 units of
    256 MiB. Anything else raises ``ValueError`` with the text, so a broken annotation or resource
    value is reported, never guessed.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"memory must be non-negative, got {text}")
        return text
    raw = text.strip()
    suffixes = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024, "u": MEMORY_UNIT_MIB}
    number, factor = raw, 1
    for suffix, multiplier in suffixes.items():
        if raw.endswith(suffix):
            number, factor = raw[: -len(suffix)], multiplier
            break
    if not number.isdigit():
        raise ValueError(f"cannot read memory quantity {text!r}: use MiB, Mi, Gi, Ti or u (256 MiB units)")
    return int(number) * factor
