"""bench/pod_watch.py runs on a few pods, and its events leave the ledger as they found it (the
bench checks that itself: an event of a kind that booked or released something would measure
another path than the one it names)."""

from __future__ import annotations

from bench.pod_watch import KINDS, measure


def test_the_bench_times_every_kind_of_event() -> None:
    result = measure(pods=4, rounds=1)
    assert {f"{kind}_us" for kind in KINDS} <= result.keys()
    assert all(result[f"{kind}_us"] > 0 for kind in KINDS)
    assert 3000 < result["event_bytes"] < 4000  # the e2e runs' 3.3 kB pods
