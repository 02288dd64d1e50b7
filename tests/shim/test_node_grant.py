"""Limits come from the node: a tenant cannot lift or switch off what the agent granted.

Each test plays the probe of issue 28 against the library built to read the node's grant (the
file the agent mounts read-only at /etc/gpupool/grant; here a file of the test's own, compiled in
the same way, never named by the environment). The grant gives 4 GiB and 30 % of the card.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.api.shim_contract import NodeGrant, encode_grant
from gpupool.shim.region import DEVICES_OFFSET, SIZE, read_region
from tests.shim.toolchain import Holder, Toolchain, codes, run_probe

OK, OUT_OF_MEMORY = 0, 2
GIB = 1 << 30
GRANTED = 4 * GIB


def grant_text(region: Path, memory_mib: int = 4096, percent: int = 30) -> str:
    return encode_grant(NodeGrant((memory_mib,), (percent,), "hard", ("GPU-standin-0",), str(region), "", "",
                                  "ns/p", "main"))


@pytest.fixture()
def granted(tc: Toolchain, work: Path) -> Iterator[Path]:
    """The node's grant for this test's container, and its region made the way the agent makes it."""
    region = work / "ctr" / "memory.region"
    region.parent.mkdir(exist_ok=True)
    region.write_bytes(b"\0" * SIZE)
    tc.grant_file.write_text(grant_text(region))
    yield region
    tc.grant_file.unlink(missing_ok=True)


def test_the_disable_switch_does_not_lift_the_grant(tc: Toolchain, work: Path, granted: Path) -> None:
    env = tc.granted_env(work, GPUPOOL_SHIM_DISABLE="1")
    steps, stderr = run_probe(tc, env, "symbol", "alloc:4g", "alloc:1")
    assert codes(steps) == [OK, OUT_OF_MEMORY]
    assert "GPUPOOL_SHIM_DISABLE=1 is ignored" in stderr


@pytest.mark.parametrize("variables", [
    pytest.param({}, id="no-variables"),
    pytest.param({"GPUPOOL_MEMORY_LIMIT_MIB": "16384", "GPUPOOL_COMPUTE_PERCENT": "100"}, id="raised"),
    pytest.param({"CUDA_DEVICE_MEMORY_LIMIT": "16g", "CUDA_DEVICE_SM_LIMIT": "100"}, id="hami-raised"),
    pytest.param({"GPUPOOL_MEMORY_LIMIT_MIB": "0", "GPUPOOL_COMPUTE_MODE": "soft"}, id="zero-means-none"),
])
def test_the_environment_cannot_raise_the_grant(tc: Toolchain, work: Path, granted: Path,
                                                variables: dict[str, str]) -> None:
    """Also for the first process of the container, alone with nobody's limits in the region."""
    steps, _ = run_probe(tc, tc.granted_env(work, **variables), "symbol", "total", "alloc:4g", "alloc:1")
    assert steps[0].values == (str(GRANTED),)
    assert codes(steps)[1:] == [OK, OUT_OF_MEMORY]
    card = read_region(granted).devices[0]
    assert (card.memory_limit_bytes, card.compute_percent, card.compute_mode) == (GRANTED, 30, "hard")


def test_the_environment_may_lower_the_grant(tc: Toolchain, work: Path, granted: Path) -> None:
    steps, _ = run_probe(tc, tc.granted_env(work, CUDA_DEVICE_MEMORY_LIMIT="1g", GPUPOOL_COMPUTE_PERCENT="10"),
                         "symbol", "total", "alloc:1g", "alloc:1")
    assert steps[0].values == (str(GIB),)
    assert codes(steps)[1:] == [OK, OUT_OF_MEMORY]
    assert read_region(granted).devices[0].compute_percent == 10


def test_another_region_directory_does_not_start_a_fresh_account(tc: Toolchain, work: Path, granted: Path) -> None:
    holder = Holder(tc, tc.granted_env(work), "alloc:3g")
    try:
        assert codes(holder.wait_ready()) == [OK, OK]
        (work / "elsewhere").mkdir()
        env = tc.granted_env(work, GPUPOOL_SHIM_DIR=str(work / "elsewhere"))
        steps, _ = run_probe(tc, env, "symbol", "alloc:2g", "alloc:1g")
        assert codes(steps) == [OUT_OF_MEMORY, OK]
        assert not (work / "elsewhere" / "memory.region").exists()
    finally:
        holder.kill()


def test_a_limit_written_into_the_region_does_not_raise_the_grant(tc: Toolchain, work: Path, granted: Path) -> None:
    """Every process of the container can write the region; what it writes there binds only lower."""
    holder = Holder(tc, tc.granted_env(work), "alloc:1g")
    try:
        assert codes(holder.wait_ready()) == [OK, OK]
        with granted.open("r+b") as fh:  # card 0's memory_limit, then its compute_percent
            fh.seek(DEVICES_OFFSET + 8)
            fh.write(struct.pack("<QI", 16 * GIB, 0))
        steps, _ = run_probe(tc, tc.granted_env(work), "symbol", "total", "alloc:4g", "alloc:3g")
        assert steps[0].values == (str(GRANTED),)
        assert codes(steps)[1:] == [OUT_OF_MEMORY, OK]
    finally:
        holder.kill()


def test_a_missing_region_refuses_instead_of_starting_a_fresh_account(tc: Toolchain, work: Path,
                                                                      granted: Path) -> None:
    """In a container the region is a mount point that cannot be deleted; should it be missing all
    the same, a process must not fall back to an account of its own (the whole grant per process)."""
    granted.unlink()
    steps, stderr = run_probe(tc, tc.granted_env(work), "symbol", "alloc:1m")
    assert codes(steps) == [OUT_OF_MEMORY]
    assert "every allocation is refused" in stderr
    assert not granted.exists()


@pytest.mark.parametrize("text", ["version=1\n", "garbage without an equals sign\n", "version=2\nmemory_mib=4096\n"])
def test_a_grant_that_cannot_be_read_refuses_everything(tc: Toolchain, work: Path, granted: Path, text: str) -> None:
    tc.grant_file.write_text(text)
    steps, stderr = run_probe(tc, tc.granted_env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024"), "symbol", "alloc:1m")
    assert codes(steps) == [OUT_OF_MEMORY]
    assert "cannot be read" in stderr


def test_without_a_grant_the_environment_still_sets_the_limits(tc: Toolchain, work: Path) -> None:
    """The library outside gpupool (no grant file): today's behaviour, the escape hatch included."""
    steps, _ = run_probe(tc, tc.granted_env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024"), "symbol", "alloc:1g", "alloc:1")
    assert codes(steps) == [OK, OUT_OF_MEMORY]
    steps, _ = run_probe(tc, tc.granted_env(work, GPUPOOL_MEMORY_LIMIT_MIB="1024", GPUPOOL_SHIM_DISABLE="1"),
                         "symbol", "alloc:2g")
    assert codes(steps) == [OK]
