"""bench/shim_gpu.py: its figures from known samples, and its answer on a machine without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.shim_gpu import (
    alone_seconds,
    median_figures,
    overhead_pct,
    percentile,
    run_figures,
    settle_s,
    share_windows,
    why_not,
)

ROOT = Path(__file__).resolve().parents[2]


def test_percentiles_interpolate_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_overhead_is_per_figure_against_the_run_without_the_library() -> None:
    runs = [run_figures({"ttft_ms": [10.0, 10.0], "token_ms": [2.0] * 99 + [4.0]}) for _ in range(3)]
    base = median_figures(runs)
    assert base["ttft_p50"] == 10.0 and base["token_p50"] == 2.0 and base["token_p99"] == pytest.approx(2.02)
    slower = {key: value * 1.01 for key, value in base.items()}
    assert overhead_pct(base, slower) == {key: 1.0 for key in base}


def test_a_share_is_products_finished_per_window_times_one_products_time_alone() -> None:
    # alone: one product per 10 ms; shared: the first second at full speed, then one per 20 ms
    # (ends half a product off the window edges)
    alone = alone_seconds([0.005 + 0.01 * i for i in range(100)])
    assert alone == pytest.approx(0.01)
    ends = [0.005 + 0.01 * i for i in range(100)] + [1.01 + 0.02 * i for i in range(100)]
    windows = share_windows(ends, alone)
    assert [round(w) for w in windows] == [100, 100, 50, 50, 50]
    assert settle_s(windows, 50, 5) == 1.0
    assert settle_s([50.0, 50.0, 80.0], 50, 5) is None  # the last window is off: not settled
    assert settle_s([52.0, 80.0, 47.0, 53.0], 50, 5) == 1.0  # settled for good only from the third


def test_without_a_gpu_it_prints_why_and_exits_zero() -> None:
    if why_not() is None:
        pytest.skip("this machine has a GPU: tests/gpu runs the benchmark")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "bench/shim_gpu.py", "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["bench"] == "shim_gpu" and line["skipped"] == why_not()
