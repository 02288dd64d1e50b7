"""More processes than the region has slots, and processes whose pid says nothing to the one
looking: every process is accounted, the dead ones' memory comes back, a live one's never does,
not even after it closed every descriptor (the library's too).

Most tests use a library compiled with a 4-slot table (``SHIM_REGION_SLOTS``), so a handful of
processes overflow it; one runs 300 processes against the format's 256 slots."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from gpupool.shim.build import RELEASE, SANITIZED, build_library
from gpupool.shim.region import SLOT, SLOTS, SLOTS_OFFSET, read_region
from tests.shim.toolchain import Holder, Toolchain, codes, run_probe

OK, OUT_OF_MEMORY = 0, 2
MIB, GIB = 1 << 20, 1 << 30
SMALL_TABLE = 4
BLOCK = 256 * MIB


def small_table_env(tc: Toolchain, work: Path, **variables: str) -> dict[str, str]:
    """The container's environment with the library compiled for a 4-slot region."""
    flavour = RELEASE if tc.flavour == RELEASE.name else SANITIZED
    library = build_library(flavour=flavour, werror=True, region_slots=SMALL_TABLE)  # cached by digest
    preload = " ".join([*tc.preload.split()[:-1], str(library)])  # a sanitizer runtime stays first
    return {**tc.env(work, **variables), "LD_PRELOAD": preload}


def held(work: Path) -> tuple[int, int, int]:
    """(bytes charged on card 0, of which by processes without a slot, processes in slots)."""
    region = read_region(work / "ctr" / "memory.region")
    return region.devices[0].used_bytes, region.devices[0].overflow_bytes, len(region.processes)


def free_and_total(tc: Toolchain, env: dict[str, str]) -> tuple[str, ...]:
    """What a newcomer sees (joining reclaims what the dead held)."""
    steps, _ = run_probe(tc, env, "symbol", "info")
    return steps[0].values


def start(tc: Toolchain, env: dict[str, str], count: int, *steps: str) -> list[Holder]:
    holders = []
    for _ in range(count):  # one after the other: which ones get the slots is known
        holders.append(Holder(tc, env, *steps))
        holders[-1].read_step()
    return holders


@pytest.mark.slow
def test_processes_without_a_slot_are_accounted_and_given_back(tc: Toolchain, work: Path) -> None:
    env = small_table_env(tc, work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    holders = start(tc, env, SMALL_TABLE + 4, "alloc:256m")
    try:
        assert held(work) == (8 * BLOCK, 4 * BLOCK, SMALL_TABLE)
        steps, _ = run_probe(tc, env, "symbol", "alloc:256m")  # no slot, exits normally: back at once
        assert codes(steps) == [OK]
        assert held(work) == (8 * BLOCK, 4 * BLOCK, SMALL_TABLE)
        steps, _ = run_probe(tc, env, "symbol", "alloc:2g", "alloc:1")  # the slot-less ones count
        assert codes(steps) == [OK, OUT_OF_MEMORY]
    finally:
        for holder in holders:
            holder.kill()  # SIGKILL: no destructor runs
    assert free_and_total(tc, env) == (str(4 * GIB), str(4 * GIB))
    assert held(work) == (0, 0, 0)


@pytest.mark.slow
def test_the_dead_are_reclaimed_and_the_living_keep_their_charge(tc: Toolchain, work: Path) -> None:
    env = small_table_env(tc, work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    go = work / "go"
    in_slots = start(tc, env, SMALL_TABLE, "alloc:256m")
    mover = Holder(tc, env, "alloc:256m", f"wait:{go}", "alloc:1m")
    mover.read_step()
    others = start(tc, env, 2, "alloc:256m")
    everyone = [*in_slots, mover, *others]
    try:
        assert held(work) == (7 * BLOCK, 3 * BLOCK, SMALL_TABLE)
        in_slots.pop(0).kill()
        go.touch()  # the mover's next charge reclaims the dead slot and moves into it
        assert codes(mover.wait_ready()) == [OK, OK, OK, OK]
        region = read_region(work / "ctr" / "memory.region")
        assert {p.pid: p.used_bytes[0] for p in region.processes}[mover.process.pid] == BLOCK + MIB
        assert held(work) == (6 * BLOCK + MIB, 2 * BLOCK, SMALL_TABLE)
        others[0].kill()  # its share stays counted while another process without a slot lives
        free_and_total(tc, env)
        assert held(work) == (6 * BLOCK + MIB, 2 * BLOCK, SMALL_TABLE)
        others[1].kill()  # the last one: the whole overflow account is given back
        assert free_and_total(tc, env) == (str(4 * GIB - 4 * BLOCK - MIB), str(4 * GIB))
        assert held(work) == (4 * BLOCK + MIB, 0, SMALL_TABLE)
    finally:
        for holder in everyone:
            holder.kill()
    assert free_and_total(tc, env) == (str(4 * GIB), str(4 * GIB))


def disguise_pid(work: Path, pid: int) -> None:
    """Rewrite a process's slot to a pid that names no process here, as one in another pid namespace
    looks: only its lock still says it lives."""
    dead = subprocess.Popen(["true"])  # its pid names no process once reaped
    dead.wait()
    region_file = work / "ctr" / "memory.region"
    data = bytearray(region_file.read_bytes())
    index = next(i for i in range(SLOTS) if SLOT.unpack_from(data, SLOTS_OFFSET + i * SLOT.size)[0] == pid)
    with region_file.open("r+b") as f:  # rewrite the pid in place: the mapping sees it
        f.seek(SLOTS_OFFSET + index * SLOT.size)
        f.write(dead.pid.to_bytes(4, "little"))


def test_a_live_process_is_not_reclaimed_when_its_pid_means_nothing_here(tc: Toolchain, work: Path) -> None:
    """A process in another pid namespace records a pid the others cannot see (or see as another
    process): its slot's lock still says it lives."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    holder = Holder(tc, env, "alloc:3g")
    try:
        holder.wait_ready()
        disguise_pid(work, holder.process.pid)
        steps, _ = run_probe(tc, env, "symbol", "alloc:2g", "info")  # would fit only if the holder were reclaimed
        assert codes(steps) == [OUT_OF_MEMORY, OK]
        assert steps[1].values == (str(GIB), str(4 * GIB))
    finally:
        holder.kill()
    assert free_and_total(tc, env) == (str(4 * GIB), str(4 * GIB))


def test_a_process_that_closed_every_descriptor_is_not_reclaimed(tc: Toolchain, work: Path) -> None:
    """A program that closes every descriptor it did not open (a daemon's start) closes the
    library's too. Its slot's lock lives on the open file description, which the region's mapping
    holds, so the lock stays (the library no longer checks its descriptor on every allocation) and
    charges go on."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    holder = Holder(tc, env, "alloc:3g", "closefds", "alloc:256m")
    try:
        assert codes(holder.wait_ready()) == [OK, OK, OK, OK]
        disguise_pid(work, holder.process.pid)
        steps, _ = run_probe(tc, env, "symbol", "alloc:1g", "info")  # would fit only if the holder were reclaimed
        assert codes(steps) == [OUT_OF_MEMORY, OK]
        assert steps[1].values == (str(4 * GIB - 3 * GIB - BLOCK), str(4 * GIB))
    finally:
        holder.kill()
    assert free_and_total(tc, env) == (str(4 * GIB), str(4 * GIB))


def test_a_forked_child_that_closed_every_descriptor_is_not_reclaimed(tc: Toolchain, work: Path) -> None:
    """A child forked without exec takes its slot's lock through a description the library opens
    itself (the mapping it inherited holds the parent's): that one is mapped too, so the lock
    outlives the child's closing every descriptor."""
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    holder = Holder(tc, env, "info", "fork:alloc:3g+closefds+alloc:256m")  # the parent in the region first
    child = 0
    try:
        steps = holder.wait_ready()
        assert [s.text.split(":")[0] for s in steps] == ["info", "alloc", "closefds", "alloc", "fork", "hold"]
        assert codes(steps) == [OK] * 6
        child = int(steps[4].values[0])
        disguise_pid(work, child)
        steps, _ = run_probe(tc, env, "symbol", "alloc:1g", "info")  # would fit only if the child were reclaimed
        assert codes(steps) == [OUT_OF_MEMORY, OK]
        assert steps[1].values == (str(4 * GIB - 3 * GIB - BLOCK), str(4 * GIB))
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        holder.kill()
    assert free_and_total(tc, env) == (str(4 * GIB), str(4 * GIB))


@pytest.mark.slow
def test_a_slotless_process_that_closed_every_descriptor_keeps_its_charge(tc: Toolchain, work: Path) -> None:
    """The overflow account is given back once no process holds its lock: a live slot-less process
    that closed the library's descriptor still holds it, so a newcomer gives back nothing."""
    env = small_table_env(tc, work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    holders = start(tc, env, SMALL_TABLE, "alloc:256m")
    slotless = Holder(tc, env, "alloc:256m", "closefds", "alloc:256m")
    holders.append(slotless)
    try:
        assert codes(slotless.wait_ready()) == [OK, OK, OK, OK]
        assert held(work) == (6 * BLOCK, 2 * BLOCK, SMALL_TABLE)
        assert free_and_total(tc, env) == (str(4 * GIB - 6 * BLOCK), str(4 * GIB))
        assert held(work) == (6 * BLOCK, 2 * BLOCK, SMALL_TABLE)
    finally:
        for holder in holders:
            holder.kill()
    assert free_and_total(tc, env) == (str(4 * GIB), str(4 * GIB))
    assert held(work) == (0, 0, 0)


@pytest.mark.slow
def test_three_hundred_processes_come_and_go(plain: Toolchain, work: Path) -> None:
    """The probe's finding: past the format's 256 slots, memory stayed charged with nothing alive."""
    env = plain.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    holders = [Holder(plain, env, "alloc:8m") for _ in range(300)]
    try:
        for holder in holders:
            holder.wait_ready()
        assert held(work) == (300 * 8 * MIB, (300 - SLOTS) * 8 * MIB, SLOTS)
    finally:
        for holder in holders:
            holder.kill()
    assert free_and_total(plain, env) == (str(4 * GIB), str(4 * GIB))
    assert held(work) == (0, 0, 0)
