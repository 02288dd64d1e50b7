"""The in-flight window of compute-limited cards: marks (events) recorded behind every few
launches, never on a stream being captured, none at all without a compute share, and none in soft
mode while the card is otherwise idle."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.shim.test_compute import CARD
from tests.shim.toolchain import RUN_TIMEOUT_S, Toolchain, run_probe

LAUNCHES = 64


def recorded_events(tc: Toolchain, env: dict[str, str], *steps: str) -> tuple[int, int]:
    """Run the probe's steps; the stand-in's count of events recorded, and of those in a capture."""
    found, _ = run_probe(tc, env, "symbol", *steps, "events")
    assert all(step.code == 0 for step in found), found
    recorded, in_capture = found[-1].values
    return int(recorded), int(in_capture)


@pytest.mark.slow
@pytest.mark.parametrize("toolchain", ["plain", "sanitized"])
def test_a_limited_card_gets_marks_behind_its_launches(request: pytest.FixtureRequest, work: Path,
                                                       toolchain: str) -> None:
    tc: Toolchain = request.getfixturevalue(toolchain)
    recorded, in_capture = recorded_events(tc, tc.env(work, GPUPOOL_COMPUTE_PERCENT="50"), f"launch:{LAUNCHES}")
    assert recorded > 0 and in_capture == 0


def test_no_mark_is_recorded_on_a_stream_being_captured(plain: Toolchain, work: Path) -> None:
    env = plain.env(work, GPUPOOL_COMPUTE_PERCENT="50")
    recorded, in_capture = recorded_events(plain, env, "capture", f"claunch:{LAUNCHES}", "endcapture")
    assert (recorded, in_capture) == (0, 0)


def test_a_card_without_a_compute_share_costs_no_events(plain: Toolchain, work: Path) -> None:
    recorded, _ = recorded_events(plain, plain.env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024"), f"launch:{LAUNCHES}")
    assert recorded == 0


def launcher_events(tc: Toolchain, env: dict[str, str], seconds: float) -> int:
    """Run the launcher alone for ``seconds``; how many events the library recorded."""
    done = subprocess.run([str(tc.launcher), "kernel", str(seconds)], env={**env, **CARD}, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (events,) = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("events")]
    return events


@pytest.mark.slow
def test_soft_mode_on_an_idle_card_holds_nothing_back(plain: Toolchain, work: Path) -> None:
    """Once the controller finds the card otherwise idle (target 100 %) a soft share records no
    marks; a hard share of the same size keeps recording them."""
    soft = launcher_events(plain, plain.env(work, GPUPOOL_COMPUTE_PERCENT="30", GPUPOOL_COMPUTE_MODE="soft"), 1.0)
    hard = launcher_events(plain, plain.env(work, GPUPOOL_COMPUTE_PERCENT="30"), 1.0)
    assert soft < hard / 2, (soft, hard)
