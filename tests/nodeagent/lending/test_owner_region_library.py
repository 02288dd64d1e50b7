"""The owner signals from a region the real interception library wrote (stand-in driver, no GPU):
the card at the container's ordinal 0 shows what its processes allocated and the share they computed at."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpupool.nodeagent.lending.owner_signals import RegionSignals, Source
from tests.shim.toolchain import RUN_TIMEOUT_S, Holder, Toolchain

SHARE = 30
TOLERANCE = 12
CARD = {"GPUPOOL_STANDIN_KERNEL_US": "4000", "GPUPOOL_STANDIN_QUEUE_US": "20000"}


@pytest.fixture()
def library(plain: Toolchain) -> Toolchain:
    """The session's plain build (tests/shim/library_fixtures.py): skipped without a compiler."""
    return plain


@pytest.mark.slow  # builds the interception library and runs it (scripts/test-all runs it)
def test_memory_and_compute_of_a_container_as_the_owner_watch_reads_them(library: Toolchain, tmp_path: Path) -> None:
    env = library.env(tmp_path, GPUPOOL_MEMORY_LIMIT_MIB="4096", GPUPOOL_COMPUTE_PERCENT=str(SHARE))
    region = tmp_path / "ctr" / "memory.region"
    signals = RegionSignals()
    holder = Holder(library, env, "alloc:512m")
    try:
        holder.wait_ready()
        held = signals.signal(region, 0, 16384)
        assert held is not None and (held.source, held.memory_mib) == (Source.REGION, 512)
        done = subprocess.run([str(library.launcher), "kernel", "1.2", "0.4-1.2"], env={**env, **CARD},
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        computing = signals.signal(region, 0, 16384)
    finally:
        holder.kill()
    assert computing is not None and computing.compute_percent is not None
    assert abs(computing.compute_percent - SHARE) <= TOLERANCE, computing
    assert computing.memory_mib == 512  # the launcher allocates nothing
