"""Lending beside host daemons (issues 26/27): nvidia-persistenced or DCGM holding a card does not keep an
idle owner's card from being lent; a host process nobody named infrastructure still does."""

from __future__ import annotations

from pathlib import Path

from gpupool.nodeagent.monitor.events import Verdict
from gpupool.nodeagent.monitor.usage_state import DeviceState, Holder
from tests.nodeagent.lending.support import holder
from tests.nodeagent.lending.world import CARD0, PODS, World, open_, run

PERSISTENCED = Holder(pid=50, start_time=50, since=0.0, infrastructure="nvidia-persistenced")
ADMIN_JOB = Holder(pid=51, start_time=51, since=0.0)
"""A host process in no pod, not named infrastructure (an admin's CUDA program)."""


def lend_with(tmp_path: Path, *others: Holder) -> list[int]:
    world = World(tmp_path, PODS)
    cards: list[int] = []

    async def body() -> None:
        service = world.started()
        world.monitor.hold(CARD0, holder("owner", 100), *others, state=DeviceState.IDLE)
        world.monitor.sample({0: 2048, 1: 2048})
        await service.step()
        cards.extend(loan.card for loan in service.loans.values())
        for loan in service.loans.values():  # the daemon is no owner: only the pod's container is
            assert loan.owners == frozenset({("ns", "owner", "c")})

    run(body)
    return cards


def test_an_idle_owners_card_that_persistenced_also_holds_is_lent(tmp_path: Path) -> None:
    assert lend_with(tmp_path, PERSISTENCED) == [0]


def test_a_host_holder_not_named_infrastructure_still_blocks_lending(tmp_path: Path) -> None:
    assert lend_with(tmp_path, PERSISTENCED, ADMIN_JOB) == []


def test_a_card_held_by_persistenced_alone_is_not_lent(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        world.monitor.hold(CARD0, PERSISTENCED, state=DeviceState.FREE)
        world.monitor.sample({0: 300})
        await service.step()
        assert service.loans == {}  # nobody to give it back to: it is free for booking, not a loan

    run(body)


def test_the_daemon_opening_a_lent_card_again_ends_no_loan_and_reclaims_nobody(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        world.monitor.hold(CARD0, holder("owner", 100), PERSISTENCED, state=DeviceState.IDLE)
        world.monitor.sample({0: 2048, 1: 2048})
        await service.step()
        assert set(service.loans) == {0}
        world.monitor.hold(CARD0, holder("owner", 100), PERSISTENCED, holder("borrower", 200),
                           state=DeviceState.IDLE)
        assert service.decide(open_(PERSISTENCED.pid)) is Verdict.ALLOW
        service.on_open(CARD0, PERSISTENCED)
        assert set(service.loans) == {0} and service.reclaiming == frozenset()

    run(body)
