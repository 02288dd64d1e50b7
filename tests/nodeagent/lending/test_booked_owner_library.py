"""An owner placed on a lent card allocates its whole share the moment its container starts, with the
real interception library on the stand-in driver (one 16 GiB card whose memory every process shares):
the lending service shrinks the loan and writes the owner's wait bound in Allocate, into the region
file no process has initialised yet; the library keeps the bound when it initialises the region, so
the owner's first allocation waits for the borrower to drain instead of running out of memory."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpupool.nodeagent.isolation.shim_files import create_region
from gpupool.nodeagent.lending.checkpoint import CheckpointEnforcement, CheckpointStore
from gpupool.nodeagent.types import GrantExtras, PodView
from gpupool.shim.region import read_region
from tests.nodeagent.lending.regions import region_path
from tests.nodeagent.lending.support import CARD_MIB, LEND, decoded, pod_json
from tests.nodeagent.lending.test_booked_owners import booked
from tests.nodeagent.lending.world import World, idle_owner
from tests.shim.toolchain import RUN_TIMEOUT_S, Holder, Toolchain, codes, parse_steps

OK, OUT_OF_MEMORY = 0, 2
SHARE_MIB = 12288
"""The arriving owner's share, and the borrower's: together with the idle owner's 2 GiB, more than the card."""


def in_container(tc: Toolchain, work: Path, state: Path, uid: str, limit_mib: int) -> dict[str, str]:
    """A process of container ``c`` of pod ``uid``: its region where the agent's layout puts it."""
    directory = region_path(state, uid).parent
    directory.mkdir(parents=True, exist_ok=True)
    return tc.env(work, GPUPOOL_SHIM_DIR=str(directory), GPUPOOL_MEMORY_LIMIT_MIB=str(limit_mib),
                  GPUPOOL_STANDIN_SHARED_MEMORY="1")


def borrower_pod() -> dict[str, Any]:
    obj = booked("borrower", SHARE_MIB, 500)
    obj["metadata"]["annotations"].update({LEND.borrowed: "true", LEND.borrowed_from: "ns/owner"})
    return obj


@pytest.mark.slow  # builds the interception library and runs it (scripts/test-all runs it)
def test_an_owner_placed_on_a_lent_card_allocating_its_share_at_start_never_runs_out_of_memory(
        plain: Toolchain, tmp_path: Path) -> None:
    state = tmp_path / "state"
    world = World(tmp_path, [pod_json("owner", cards=(0,)), borrower_pod()])
    idle = Holder(plain, in_container(plain, tmp_path, state, "uid-owner", 4096), "alloc:2g")
    borrower = Holder(plain, in_container(plain, tmp_path, state, "uid-borrower", SHARE_MIB), "alloc:12g")

    class Library:  # the interception library's backend: Allocate creates the container's region file
        def grant_extras(self, pod: PodView, container: str) -> GrantExtras:
            path = region_path(state, pod.uid, container)
            path.parent.mkdir(parents=True, exist_ok=True)
            create_region(str(path))
            return GrantExtras()

    async def body() -> tuple[int, float]:
        service = world.started(shim_state_dir=str(state))
        enforcement = CheckpointEnforcement(Library(), CheckpointStore(str(tmp_path / "ckpt"), 1),  # type: ignore[arg-type]
                                            world.pods.get)
        enforcement.granted = service.owner_granted
        idle_owner(world)  # 2 GiB held, idle
        await service.step()
        assert service.loans[0].memory_mib == CARD_MIB - 2048
        arrive = booked("newcomer", SHARE_MIB, 300)
        [pod] = decoded(arrive)
        world.pods.on_event("ADDED", pod)  # the extender placed an owner on the card: its owners' budget fits
        assert isinstance(pod.view, PodView)
        enforcement.grant_extras(pod.view, "c")  # Allocate: the loan shrinks below the borrower, who is frozen
        assert service.loans[0].memory_mib == CARD_MIB - 2048 - SHARE_MIB
        assert read_region(region_path(state, "uid-borrower")).devices[0].memory_limit_bytes == SHARE_MIB << 20
        drained = threading.Timer(0.5, borrower.kill)  # its checkpoint deadline ends: stopped, memory freed
        drained.start()
        began = time.monotonic()  # the container starts and allocates its whole share at once
        done = await asyncio.to_thread(
            subprocess.run, [str(plain.probe), "symbol", f"alloc:{SHARE_MIB // 1024}g"],
            env=in_container(plain, tmp_path, state, "uid-newcomer", SHARE_MIB), capture_output=True, text=True,
            timeout=RUN_TIMEOUT_S, check=True)
        seconds = time.monotonic() - began
        drained.join()
        [step] = parse_steps(done.stdout)
        return step.code, seconds

    try:
        assert codes(idle.wait_ready()) == [OK, OK]
        assert codes(borrower.wait_ready()) == [OK, OK]  # 14 GiB of the 16 GiB card are taken
        code, seconds = asyncio.run(body())
    finally:
        idle.kill()
        if borrower.process.poll() is None:
            borrower.kill()
    assert code == OK, "the arriving owner's whole share fits once the borrower drained"
    assert 0.4 < seconds < 5, seconds
    print(f"\n  the arriving owner's first allocation on the lent card: {seconds * 1000:.0f} ms "
          "(the borrower drained after 500 ms)")
