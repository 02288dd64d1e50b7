"""Client-caused log lines: the first of an interval in full, the rest as one counted summary."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpupool.netguard.summary_log import SummaryLog


def test_a_flood_is_one_line_plus_one_summary_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    events = SummaryLog(logging.getLogger("t"), "refusals", interval_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "t"):
        for i in range(1000):
            events.note("token" if i % 2 else "malformed", "refused %d", i)
        now[0] = 61.0
        events.note("token", "refused again")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["refused 0", "999 more refusals in the last 60 s (malformed: 499, token: 500)", "refused again"]
    assert events.lines == 3


def test_the_summary_comes_at_the_end_of_the_interval_without_another_event(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        events = SummaryLog(logging.getLogger("t"), "drops", interval_s=0.05)
        for _ in range(3):
            events.note("evicted", "dropped")
        await asyncio.sleep(0.2)

    with caplog.at_level(logging.WARNING, "t"):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == ["dropped", "2 more drops in the last 0.05 s (evicted: 2)"]
