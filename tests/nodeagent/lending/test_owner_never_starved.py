"""The lending service's writes into the library's regions (seed 000, case A): the owners of a lent
card wait for room on it, a borrower being reclaimed is frozen the moment its owner is back, and the
owners' wait ends once the card is theirs again. (The library's side: tests/shim/test_owner_waits.py.)"""

from __future__ import annotations

from pathlib import Path

from gpupool.nodeagent.lending.region_control import OWNER_WAIT_MARGIN_S
from gpupool.nodeagent.monitor.usage_state import DeviceState
from gpupool.shim.region import read_region
from tests.nodeagent.lending.regions import MIB, write_region
from tests.nodeagent.lending.support import holder
from tests.nodeagent.lending.world import CARD0, PODS, World, idle_owner, open_, run, settle


def test_owners_wait_while_lent_and_a_returning_owner_freezes_its_borrower_at_once(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)
    state = tmp_path / "state"
    owner = write_region(state, "uid-owner", {0: (2048, 0)})
    borrower = write_region(state, "uid-borrower", {0: (6000, 97)})
    other_owner = write_region(state, "uid-owner1", {0: (1024, 0)})

    async def body() -> None:
        service = world.started(shim_state_dir=str(state))
        assert read_region(owner).devices[0].wait_ns == 0
        idle_owner(world)
        await service.step()  # lent
        bound = int((1 + OWNER_WAIT_MARGIN_S) * 1e9)  # the world's checkpoint deadline is 1 s
        assert read_region(owner).devices[0].wait_ns == bound
        assert read_region(other_owner).devices[0].wait_ns == 0, "card 1 is not lent"
        assert read_region(borrower).devices[0].memory_limit_bytes == 0
        world.processes.alive = {200: "id-borrower"}
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
        service.decide(open_(101))  # the owner is back: rule 1
        frozen = read_region(borrower).devices[0]
        assert frozen.memory_limit_bytes == frozen.used_bytes == 6000 * MIB, "frozen before any signal"
        assert world.processes.sent == []
        await service.step()
        assert read_region(owner).devices[0].wait_ns == bound, "still waiting while the borrower drains"
        await settle(service)
        await service.step()
        assert read_region(owner).devices[0].wait_ns == 0, "the card is the owner's again: a full card fails at once"

    run(body)


def test_a_frozen_limit_never_rises(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)
    state = tmp_path / "state"
    borrower = write_region(state, "uid-borrower", {0: (0, 0)})

    async def body() -> None:
        service = world.started(shim_state_dir=str(state))
        world.monitor.hold(CARD0, holder("owner", 100))  # busy, not lent
        world.processes.alive = {200: "id-borrower"}
        service.on_open(CARD0, holder("borrower", 200))  # rule 3: the borrower is reclaimed
        assert read_region(borrower).devices[0].memory_limit_bytes == 1, "holding nothing: one byte (0 is no limit)"
        await settle(service)

    run(body)


def test_without_the_library_nothing_is_written(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        assert service.regions is None and service.loans

    run(body)
