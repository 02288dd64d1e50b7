"""bench/lending_filter.py measures what it says: the borrower passes every lending node, the
high-priority pod none."""

from __future__ import annotations

from bench.lending_filter import measure


def test_the_bench_borrower_passes_the_lending_nodes_and_the_high_priority_pod_none() -> None:
    result = measure(40, 5, 3, rounds=2)
    assert result["borrower_passed"] == 5
    assert result["high_priority_passed"] == 0
    assert result["borrower_filter_median_ms"] > 0
