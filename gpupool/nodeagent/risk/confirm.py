"""Hold back a ``region-tampered`` finding until a second NVML sample agrees with the first.

The two figures it compares are not read at one instant: NVML's sample is up to a second old when
the region is read. A process that freed its memory in between (the library takes the charge off
the region at the free) leaves a stale driver figure above a fresh account, a disagreement that
lasts one sample. A tampered account stays down, so a finding counts only when a later sample (a
later sample time, read on a later round) shows it again; it costs one round (``CHECK_EVERY_S``)
of delay. The other kinds need no such wait: each of them rests on one sample alone.
"""

from __future__ import annotations

from gpupool.nodeagent.risk.findings import Risk, RiskKind

CONFIRMED_KINDS = frozenset({RiskKind.REGION_TAMPERED})
RiskKey = tuple[str, int, str, str, str, int, int]


class Confirmation:
    """Passes a finding of :data:`CONFIRMED_KINDS` once two distinct samples have shown it."""

    def __init__(self) -> None:
        self._first_seen: dict[RiskKey, float] = {}

    def filter(self, risks: list[Risk], sample_time: float | None) -> list[Risk]:
        """``risks`` without the findings seen in no earlier sample; forgets those gone."""
        seen: dict[RiskKey, float] = {}
        passed = []
        for risk in risks:
            if risk.kind not in CONFIRMED_KINDS:
                passed.append(risk)
                continue
            if sample_time is None:
                continue
            first = seen[risk.key] = self._first_seen.get(risk.key, sample_time)
            if sample_time > first:
                passed.append(risk)
        self._first_seen = seen
        return passed
