"""bench/shim_gpu.py on a real GPU, shortened: every figure is there and the library did not break
the decode loop. The figures themselves are the benchmark's to report, not a test's to time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.shim_gpu import why_not

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")


def test_the_benchmark_reports_every_figure() -> None:
    done = subprocess.run([sys.executable, "bench/shim_gpu.py", "--json", "--runs", "1", "--requests", "2",
                           "--tokens", "16", "--spin-seconds", "3"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(line["decode_ms"]) == {"none", "memory", "memory_soft50"}
    assert set(line["overhead_pct"]["memory"]) == {"ttft_p50", "ttft_p99", "token_p50", "token_p99"}
    assert len(line["hard_share"]["windows_pct"]) >= 5 and set(line["met"]) == {
        "memory_p50", "memory_p99", "hard_share_settles_within_1s"}
