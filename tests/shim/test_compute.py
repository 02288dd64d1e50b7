"""Compute shares: measured from the stand-in driver's card timeline (the busy time NVML reports),
so a loaded machine slows the launcher down but does not fake its numbers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.shim.toolchain import RUN_TIMEOUT_S, Toolchain, assert_clean

# Slow, so scripts/test-all runs it and a plain pytest does not: compute shares measured over seconds of kernel
# launches, sanitizer builds included.
pytestmark = pytest.mark.slow

TOLERANCE = 10.0  # percentage points around the share
SATURATED = 80.0  # a launcher alone and unthrottled keeps the card at least this busy (loaded machine)
#: Kernels of 4 ms and a 20 ms launch queue: a launcher starved of CPU for a while on a loaded
#: machine still finds the card busy when it runs again, as with a real driver's deep queue.
CARD = {"GPUPOOL_STANDIN_KERNEL_US": "4000", "GPUPOOL_STANDIN_QUEUE_US": "20000"}


#: A card whose queue holds a second of 1 ms kernels, as a real one holds a thousand launches: a
#: launcher left alone queues all of it before the controller's first measurement.
DEEP_QUEUE_CARD = {"GPUPOOL_STANDIN_KERNEL_US": "1000", "GPUPOOL_STANDIN_QUEUE_US": "1000000"}


def launch(tc: Toolchain, env: dict[str, str], api: str, seconds: float, *windows: str,
           neighbour_at: float | None = None, card: dict[str, str] = CARD) -> list[float]:
    """Run the launcher; the percentage of each window it kept the card busy."""
    args = [str(tc.launcher), api, str(seconds), *windows]
    if neighbour_at is not None:
        args += ["--neighbour-at", str(neighbour_at)]
    done = subprocess.run(args, env={**env, **card}, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert_clean(done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    return [float(line.split()[3]) for line in done.stdout.splitlines() if line.startswith("window")]


def test_without_a_share_a_launcher_saturates_the_card(plain: Toolchain, work: Path) -> None:
    (busy,) = launch(plain, plain.env(work), "kernel", 1.0, "0.2-1.0")
    assert busy >= SATURATED


@pytest.mark.parametrize("api", ["kernel", "kernelex", "cooperative", "graph"])
def test_hard_mode_keeps_utilisation_at_the_share(plain: Toolchain, work: Path, api: str) -> None:
    env = plain.env(work, GPUPOOL_COMPUTE_PERCENT="30")
    (busy,) = launch(plain, env, api, 1.6, "0.5-1.6")
    assert abs(busy - 30) <= TOLERANCE, busy


@pytest.mark.parametrize("api", ["kernel", "graph"])
def test_a_launcher_that_queues_far_ahead_is_held_to_its_share(plain: Toolchain, work: Path, api: str) -> None:
    env = plain.env(work, GPUPOOL_COMPUTE_PERCENT="30")
    (busy,) = launch(plain, env, api, 2.0, "0.6-2.0", card=DEEP_QUEUE_CARD)
    assert abs(busy - 30) <= TOLERANCE, busy


def test_a_launcher_alone_still_fills_a_deep_queue(plain: Toolchain, work: Path) -> None:
    """The window only exists for limited cards: without a share nothing holds the launches back."""
    (busy,) = launch(plain, plain.env(work), "kernel", 1.0, "0.2-1.0", card=DEEP_QUEUE_CARD)
    assert busy >= SATURATED


def test_hard_mode_under_sanitizers(sanitized: Toolchain, work: Path) -> None:
    env = sanitized.env(work, GPUPOOL_COMPUTE_PERCENT="40")
    (busy,) = launch(sanitized, env, "kernel", 2.0, "0.6-2.0")
    assert abs(busy - 40) <= TOLERANCE, busy


@pytest.mark.parametrize("toolchain", ["plain", "sanitized"])
def test_soft_mode_uses_an_idle_card_and_falls_back_when_a_neighbour_appears(
        request: pytest.FixtureRequest, work: Path, toolchain: str) -> None:
    tc: Toolchain = request.getfixturevalue(toolchain)
    env = tc.env(work, GPUPOOL_COMPUTE_PERCENT="30", GPUPOOL_COMPUTE_MODE="soft")
    alone, shared = launch(tc, env, "kernel", 3.5, "0.3-1.5", "2.3-3.5", neighbour_at=1.5)
    assert alone >= SATURATED - 10, alone
    assert shared <= 30 + TOLERANCE, shared  # what soft mode promises: back to its share beside a neighbour
    # Below the share is the CPU's doing, not the throttle's: the stand-in card runs both
    # launchers' kernels in one FIFO queue, and whichever process gets a core when a slot frees
    # fills it. With two busy loops beside it on this two-core machine the launcher measured
    # 12-30 % over eight runs (idle: 29.7-30.5 %), and a CI run once 9.1 %. No lower bound above
    # zero holds under arbitrary load; what must hold is that it keeps running.
    assert shared > 0, shared


def test_hami_sm_limit_sets_the_share(plain: Toolchain, work: Path) -> None:
    (busy,) = launch(plain, plain.env(work, CUDA_DEVICE_SM_LIMIT="50"), "kernel", 2.0, "0.6-2.0")
    assert abs(busy - 50) <= TOLERANCE, busy


def test_the_processes_of_a_container_share_one_share(plain: Toolchain, work: Path) -> None:
    env = {**plain.env(work, GPUPOOL_COMPUTE_PERCENT="40"), **CARD}
    args = [str(plain.launcher), "kernel", "2.5", "0.8-2.5"]
    runs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [r.communicate(timeout=RUN_TIMEOUT_S) for r in runs]
    total = sum(float(line.split()[3]) for out, _ in outputs for line in out.splitlines() if line.startswith("window"))
    assert abs(total - 40) <= TOLERANCE, outputs
