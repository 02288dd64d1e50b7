"""Memory limits across the processes of one container: one budget, concurrent allocation, dead
processes' memory reclaimed, the region file's contents."""

from __future__ import annotations

from pathlib import Path

from gpupool.shim.region import read_region
from tests.shim.toolchain import Holder, Toolchain, codes, run_probe

OK, OUT_OF_MEMORY = 0, 2
MIB, GIB = 1 << 20, 1 << 30
RACERS = 4
BLOCK_MIB = 64
LIMIT_MIB = 4096


def test_four_processes_allocating_at_once_never_exceed_the_limit(tc: Toolchain, work: Path) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB=str(LIMIT_MIB))
    start = work / "go"
    # Each racer alone could take the whole budget; together they must share it exactly.
    racers = [Holder(tc, env, f"wait:{start}", f"grab:{BLOCK_MIB}m:{LIMIT_MIB // BLOCK_MIB}") for _ in range(RACERS)]
    try:
        start.touch()
        grabbed = [int(r.wait_ready()[1].values[0]) for r in racers]
        assert sum(grabbed) == LIMIT_MIB // BLOCK_MIB, grabbed
        region = read_region(work / "ctr" / "memory.region")
        assert region.devices[0].used_bytes == LIMIT_MIB * MIB
        held = {p.pid: p.used_bytes[0] for p in region.processes}
        assert held == {r.process.pid: g * BLOCK_MIB * MIB for r, g in zip(racers, grabbed, strict=True)}
    finally:
        for racer in racers:
            racer.kill()


def test_a_killed_process_memory_comes_back(tc: Toolchain, work: Path) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    killed = work / "killed"
    victim = Holder(tc, env, "alloc:3g")
    try:
        assert codes(victim.wait_ready()) == [OK, OK]
        survivor = Holder(tc, env, "alloc:3g", f"wait:{killed}", "alloc:3g")
        assert survivor.read_step().code == OUT_OF_MEMORY  # joined, and refused, before the kill
    finally:
        victim.kill()  # SIGKILL: no destructor, no free
    try:
        killed.touch()
        assert codes(survivor.wait_ready()) == [OUT_OF_MEMORY, OK, OK, OK]
    finally:
        survivor.kill()
    steps, _ = run_probe(tc, env, "symbol", "alloc:3g", "info")  # a newcomer too
    assert codes(steps) == [OK, OK]
    assert steps[1].values == (str(GIB), str(4 * GIB))


def test_a_process_that_exits_gives_its_memory_back_at_once(tc: Toolchain, work: Path) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    run_probe(tc, env, "symbol", "alloc:3g")  # exits without freeing
    region = read_region(work / "ctr" / "memory.region")
    assert region.devices[0].used_bytes == 0
    assert region.processes == ()


def test_processes_share_one_budget(tc: Toolchain, work: Path) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    holder = Holder(tc, env, "alloc:3g")
    try:
        holder.wait_ready()
        steps, _ = run_probe(tc, env, "procaddress", "info", "alloc:1g", "alloc:1")
        assert steps[0].values == (str(GIB), str(4 * GIB))
        assert codes(steps)[1:] == [OK, OUT_OF_MEMORY]
    finally:
        holder.kill()


def test_the_smallest_limit_any_live_process_declared_holds(tc: Toolchain, work: Path) -> None:
    holder = Holder(tc, tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096"), "alloc:1g")
    try:
        holder.wait_ready()
        raised = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="999999")  # a process that edited its environment
        steps, _ = run_probe(tc, raised, "symbol", "alloc:3g", "alloc:1")
        assert codes(steps) == [OK, OUT_OF_MEMORY]
        cleared = tc.env(work)  # ... or lost it: the container's region still names the limit
        steps, _ = run_probe(tc, cleared, "symbol", "info", "alloc:3g", "alloc:1")
        assert steps[0].values == (str(3 * GIB), str(4 * GIB))
        assert codes(steps)[1:] == [OK, OUT_OF_MEMORY]
    finally:
        holder.kill()


def test_another_container_has_a_budget_of_its_own(tc: Toolchain, work: Path) -> None:
    env = tc.env(work, GPUPOOL_MEMORY_LIMIT_MIB="4096")
    holder = Holder(tc, env, "alloc:3g")
    try:
        holder.wait_ready()
        (work / "other").mkdir()
        other = {**env, "GPUPOOL_SHIM_DIR": str(work / "other")}
        steps, _ = run_probe(tc, other, "symbol", "alloc:3g")
        assert codes(steps) == [OK]
    finally:
        holder.kill()
