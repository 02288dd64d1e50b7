"""An owner that computes again without opening its lent card gets it back; nothing else ends the loan."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.nodeagent.lending.options import ActivityThresholds
from gpupool.nodeagent.lending.rules import Rule
from gpupool.nodeagent.lending.service import LendingService
from gpupool.nodeagent.monitor.usage_sampling import ProcessUsage
from gpupool.nodeagent.monitor.usage_state import DeviceState
from tests.nodeagent.lending.regions import region_path, write_region
from tests.nodeagent.lending.support import NAMES, holder, pod_json
from tests.nodeagent.lending.world import CARD0, CARD1, PODS, World, idle_owner, run, settle, tick

SAMPLES = 3
THRESHOLDS = ActivityThresholds(percent=10, memory_mib=256, samples=SAMPLES)


async def lent(world: World, tmp: Path) -> LendingService:
    """Card 0 lent by ns/owner (pid 100), held by ns/borrower (pids 200, 201) too."""
    service = world.started(THRESHOLDS, str(tmp / "state"))
    idle_owner(world)
    await service.step()
    assert set(service.loans) == {0}
    world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
    world.processes.alive = {200: "id-borrower", 201: "id-borrower"}
    return service


async def samples(service: LendingService, world: World, count: int, **sample: object) -> None:
    for _ in range(count):
        tick(world, **sample)  # type: ignore[arg-type]
        await service.step()


def assert_returned(service: LendingService, world: World) -> None:
    assert service.loans == {} and world.api.evicted == [("ns", "borrower")]
    assert sorted(world.processes.sent) == [(200, "SIGUSR1"), (201, "SIGUSR1")]
    assert service.device_list(NAMES.gpu_mem) == [] and world.api.annotations[-1] is None
    [(path, decision)] = service.decisions
    assert path == CARD0 and decision.rule is Rule.RECLAIM_LOW_HOLDER and decision.reclaim == (("ns", "borrower"),)


def test_the_owner_computing_in_its_region_ends_the_loan_like_an_open(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = await lent(world, tmp_path)
        write_region(tmp_path / "state", "uid-owner", {0: (2048, 80)})
        await samples(service, world, SAMPLES - 1, util={0: 95})
        assert set(service.loans) == {0} and not world.processes.sent  # not yet: N samples in a row
        await samples(service, world, 1, util={0: 95})
        await settle(service)
        assert_returned(service, world)

    run(body)


def test_the_owner_computing_by_nvml_ends_the_loan(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = await lent(world, tmp_path)
        busy = (ProcessUsage(100, 1024, 40), ProcessUsage(200, 3000, 50))
        await samples(service, world, SAMPLES, util={0: 90}, processes={0: busy})
        await settle(service)
        assert_returned(service, world)

    run(body)


def test_the_owner_allocating_memory_ends_the_loan_and_the_card_waits_for_a_new_idle_period(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = await lent(world, tmp_path)
        await samples(service, world, 1, processes={0: (ProcessUsage(100, 1024, 0),)})
        await samples(service, world, SAMPLES, processes={0: (ProcessUsage(100, 1024 + 512, 0),)})
        await settle(service)
        assert_returned(service, world)
        world.monitor.hold(CARD0, holder("owner", 100), state=DeviceState.IDLE)  # no SM use: still idle
        await samples(service, world, 2)
        assert service.loans == {}  # not lent again within the same idle period
        world.monitor.hold(CARD0, holder("owner", 100), state=DeviceState.BUSY)
        await samples(service, world, 1)
        world.monitor.hold(CARD0, holder("owner", 100), state=DeviceState.IDLE)
        await samples(service, world, 1)
        assert set(service.loans) == {0}  # a new idle period lends it again

    run(body)


def test_the_borrower_computing_does_not_end_the_loan(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = await lent(world, tmp_path)
        write_region(tmp_path / "state", "uid-owner", {0: (2048, 0)})
        write_region(tmp_path / "state", "uid-borrower", {0: (6000, 97)})
        greedy = (ProcessUsage(100, 2048, 0), ProcessUsage(200, 6000, 97), ProcessUsage(201, 2000, 3))
        await samples(service, world, 1, util={0: 100}, processes={0: (ProcessUsage(100, 2048, 0),)})
        await samples(service, world, 3 * SAMPLES, util={0: 100}, processes={0: greedy})
        await settle(service)
        assert set(service.loans) == {0} and not world.processes.sent and not world.api.evicted

    run(body)


def test_a_broken_or_missing_region_never_ends_a_loan_or_stops_the_agent(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = await lent(world, tmp_path)
        idle_owner(world, CARD1, "owner1", 300)
        await samples(service, world, 1)
        assert set(service.loans) == {0, 1}
        broken = region_path(tmp_path / "state", "uid-owner")
        broken.parent.mkdir(parents=True)
        broken.write_bytes(b"\x47\x50\x53\x52garbage")  # owner1 has no region at all
        await samples(service, world, 3 * SAMPLES, util={0: 100, 1: 100})
        assert set(service.loans) == {0, 1} and not world.processes.sent

    run(body)


def test_one_sample_counts_once_however_often_the_service_steps(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = await lent(world, tmp_path)
        write_region(tmp_path / "state", "uid-owner", {0: (2048, 80)})
        tick(world, util={0: 95})
        for _ in range(3 * SAMPLES):
            await service.step()
        assert set(service.loans) == {0}

    run(body)


def test_without_the_library_the_regions_are_not_read(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started(THRESHOLDS, None)
        idle_owner(world)
        await service.step()
        write_region(tmp_path / "state", "uid-owner", {0: (2048, 80)})
        await samples(service, world, 2 * SAMPLES, util={0: 95})
        assert set(service.loans) == {0}

    run(body)


@pytest.mark.parametrize(("region", "ends"), [
    pytest.param({0: (1024, 0), 1: (2048, 80)}, True, id="card-0-is-ordinal-1:-computing"),
    pytest.param({0: (1024, 80), 1: (2048, 0)}, False, id="ordinal-0-is-card-1:-not-the-lent-card"),
])
def test_the_region_is_read_at_the_lent_cards_ordinal_in_the_owner(tmp_path: Path, region: dict[int, tuple[int, int]],
                                                                   ends: bool) -> None:
    pods = [pod_json("owner", cards=(1, 0)), *PODS[1:]]  # the owner sees card 1 as ordinal 0, card 0 as 1
    world = World(tmp_path, pods)

    async def body() -> None:
        service = await lent(world, tmp_path)
        write_region(tmp_path / "state", "uid-owner", region)
        await samples(service, world, SAMPLES, util={0: 95, 1: 95})
        await settle(service)
        assert (service.loans == {}) is ends

    run(body)
