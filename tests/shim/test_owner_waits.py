"""An owner is never starved by its borrower (seed 000, case A): on one card whose memory every process
shares (the stand-in driver with ``GPUPOOL_STANDIN_SHARED_MEMORY=1``), an owner that comes back to
its lent card and allocates its whole share while the borrower still holds the rest waits for the
borrower to drain instead of running out of memory; the borrower, frozen by the agent's write into
its region, allocates nothing more. The agent's two writes are :func:`gpupool.shim.region.set_wait`
(when the card is lent) and :func:`gpupool.shim.region.freeze_memory` (when the owner is back)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpupool.shim.region import freeze_memory, read_region, set_wait
from tests.shim.toolchain import RUN_TIMEOUT_S, Holder, Toolchain, codes, parse_steps

OK, OUT_OF_MEMORY = 0, 2
GIB = 1 << 30


def container(tc: Toolchain, work: Path, name: str, limit_mib: int) -> dict[str, str]:
    """The environment of a process in container ``name`` on the shared 16 GiB stand-in card."""
    (work / name).mkdir(exist_ok=True)
    return tc.env(work, GPUPOOL_SHIM_DIR=str(work / name), GPUPOOL_MEMORY_LIMIT_MIB=str(limit_mib),
                  GPUPOOL_STANDIN_SHARED_MEMORY="1")


def owner_allocates(tc: Toolchain, env: dict[str, str], size: str) -> tuple[int, float]:
    """A new process of the owner allocates ``size``: its CUresult and the seconds the step took."""
    began = time.monotonic()
    done = subprocess.run([str(tc.probe), "symbol", size], env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=True)
    [step] = parse_steps(done.stdout)
    return step.code, time.monotonic() - began


@pytest.mark.parametrize("allocation", ["alloc:10g", "pitch:65536x163840", "async:10g"])
def test_an_owner_allocating_its_full_share_during_a_reclaim_never_runs_out_of_memory(
        plain: Toolchain, work: Path, allocation: str) -> None:
    owner_env = container(plain, work, "owner", 12288)  # its share: 12 GiB of the 16 GiB card
    borrower_env = container(plain, work, "borrower", 14336)  # the loan: all but the 2 GiB the owner holds
    idle_owner = Holder(plain, owner_env, "alloc:2g")
    go = work / "go"
    borrower = Holder(plain, borrower_env, "alloc:12g", f"wait:{go}", "alloc:1m")
    try:
        assert codes(idle_owner.wait_ready()) == [OK, OK]
        set_wait(work / "owner" / "memory.region", 0, int(15e9))  # the card is lent
        assert borrower.read_step().code == OK  # the borrower takes 12 GiB: 2 GiB are left on the card
        # The owner is back: the agent freezes the borrower and starts its reclaim.
        assert freeze_memory(work / "borrower" / "memory.region", 0) == 12 * GIB
        go.touch()
        assert [borrower.read_step().code for _ in range(2)] == [OK, OUT_OF_MEMORY], "frozen: nothing more"
        drained = threading.Timer(0.5, borrower.kill)  # its checkpoint deadline ends: stopped, memory freed
        drained.start()
        code, seconds = owner_allocates(plain, owner_env, allocation)
        drained.join()
        assert code == OK, "the owner's whole share fits the card once its borrower drained"
        assert 0.4 < seconds < 5, seconds
        print(f"\n  owner's first allocation ({allocation}) during the reclaim: {seconds * 1000:.0f} ms "
              "(the borrower drained after 500 ms)")
    finally:
        idle_owner.kill()
        if borrower.process.poll() is None:
            borrower.kill()


def test_without_a_loan_a_full_card_fails_at_once(plain: Toolchain, work: Path) -> None:
    other_env = container(plain, work, "other", 16384)
    owner_env = container(plain, work, "owner", 16384)
    other = Holder(plain, other_env, "alloc:15g")
    try:
        assert codes(other.wait_ready()) == [OK, OK]
        code, seconds = owner_allocates(plain, owner_env, "alloc:2g")
        assert code == OUT_OF_MEMORY and seconds < 2
    finally:
        other.kill()


def test_the_wait_is_bounded(plain: Toolchain, work: Path) -> None:
    borrower_env = container(plain, work, "borrower", 16384)
    owner_env = container(plain, work, "owner", 16384)
    borrower = Holder(plain, borrower_env, "alloc:15g")
    idle_owner = Holder(plain, owner_env, "alloc:1m")
    try:
        assert codes(borrower.wait_ready()) == [OK, OK] and codes(idle_owner.wait_ready()) == [OK, OK]
        set_wait(work / "owner" / "memory.region", 0, int(0.3e9))
        assert read_region(work / "owner" / "memory.region").devices[0].wait_ns == int(0.3e9)
        code, seconds = owner_allocates(plain, owner_env, "alloc:2g")  # the borrower never leaves
        assert code == OUT_OF_MEMORY and 0.25 < seconds < 3, seconds
    finally:
        borrower.kill()
        idle_owner.kill()
