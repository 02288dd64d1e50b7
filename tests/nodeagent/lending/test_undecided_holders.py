"""Lending beside an undecided holder (issue 26): a pod's process the monitor recorded before the pod
watch listed, where it could be infrastructure (``--infrastructure-namespaces``), is neither an owner,
nor a bar, nor reclaimed, and a card it holds is not lent until the monitor has judged it. Here it is
the GPU Operator's DCGM exporter restored from a previous agent's file without its mark: a
system-node-critical pod with no gpupool share, which, judged as an ordinary holder, would bar the
borrowers (rule 3) and never let the card be lent."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpupool.nodeagent.lending.reclaim_journal import JOURNAL_FILE
from gpupool.nodeagent.monitor.events import Verdict
from gpupool.nodeagent.monitor.usage_state import DeviceState, Holder, ProcessIdentity
from tests.nodeagent.lending.support import holder
from tests.nodeagent.lending.test_infrastructure_holders import EXPORTER, WITH_EXPORTER
from tests.nodeagent.lending.world import CARD0, PODS, World, idle_owner, open_, run, settle

UNDECIDED = replace(EXPORTER, infrastructure="", undecided=True)
"""The exporter as restored before the pod watch listed: its pod's names, no mark, not judged yet."""


def test_an_idle_owners_card_is_not_lent_while_an_undecided_holder_holds_it_and_is_once_judged(
        tmp_path: Path) -> None:
    world = World(tmp_path, WITH_EXPORTER)

    async def body() -> None:
        service = world.started()
        world.monitor.hold(CARD0, holder("owner", 100), UNDECIDED, state=DeviceState.IDLE)
        world.monitor.sample({0: 2048, 1: 2048})
        await service.step()
        assert service.loans == {}  # it may be a tenant's: nothing lent yet
        world.monitor.hold(CARD0, holder("owner", 100), EXPORTER, state=DeviceState.IDLE)  # judged: infrastructure
        await service.step()
        assert set(service.loans) == {0}
        assert service.loans[0].owners == frozenset({("ns", "owner", "c")})

    run(body)


def test_an_undecided_holder_bars_no_borrower_and_its_open_reclaims_nobody(tmp_path: Path) -> None:
    world = World(tmp_path, WITH_EXPORTER)
    world.identities[EXPORTER.pid] = ProcessIdentity(EXPORTER.container_id, EXPORTER.container, EXPORTER.pod,
                                                     EXPORTER.namespace)

    async def body() -> None:
        service = world.started()
        world.monitor.hold(CARD0, holder("owner", 100), state=DeviceState.IDLE)
        world.monitor.sample({0: 2048, 1: 2048})
        await service.step()
        assert set(service.loans) == {0}
        world.monitor.hold(CARD0, holder("owner", 100), UNDECIDED, state=DeviceState.IDLE)
        assert service.decide(open_(200)) is Verdict.ALLOW  # the borrower: the undecided one is no high holder
        world.processes.alive[200] = "id-borrower"
        world.processes.alive[EXPORTER.pid] = EXPORTER.container_id
        world.monitor.hold(CARD0, holder("owner", 100), UNDECIDED, holder("borrower", 200), state=DeviceState.IDLE)
        service.on_open(CARD0, holder("borrower", 200))
        service.on_open(CARD0, UNDECIDED)  # as recorded: not judged, so neither an asker nor reclaimed
        await service.step()
        await settle(service)
        assert set(service.loans) == {0} and service.reclaiming == frozenset()
        assert world.processes.sent == [] and service.refusals() == {}

    run(body)


def test_the_same_holder_judged_ordinary_bars_lending_as_before(tmp_path: Path) -> None:
    """The control: once decided a tenant's (here: no mark, as in another namespace), rule 3 applies."""
    world = World(tmp_path, WITH_EXPORTER)
    decided: Holder = replace(UNDECIDED, undecided=False)

    async def body() -> None:
        service = world.started()
        world.monitor.hold(CARD0, holder("owner", 100), decided, state=DeviceState.IDLE)
        world.monitor.sample({0: 2048, 1: 2048})
        await service.step()
        assert service.loans == {}

    run(body)


def test_a_borrower_left_beside_its_owner_is_judged_after_the_monitor_decided_it(tmp_path: Path) -> None:
    """The restart's check of borrowers (run once, when the pods are listed) waits for the monitor to
    judge its undecided holders, so a borrower recorded undecided is still stopped, once it is decided."""
    world = World(tmp_path, PODS)
    world.processes.alive = {200: "id-borrower"}

    async def body() -> None:
        first = world.started()
        idle_owner(world)
        await first.step()
        assert set(first.loans) == {0}
        (tmp_path / JOURNAL_FILE).write_text("garbage")  # no loan is resumed: the card is not lent any more
        undecided = replace(holder("borrower", 200), undecided=True)
        world.monitor.hold(CARD0, holder("owner", 100), undecided, state=DeviceState.IDLE)
        again = world.started()
        await again.step()
        await settle(again)
        assert world.api.evicted == [] and 200 in world.processes.alive  # not judged while undecided
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
        await again.step()  # decided: the borrower beside its owner on a card not lent is stopped
        await settle(again)
        assert world.api.evicted == [("ns", "borrower")] and 200 not in world.processes.alive

    run(body)


def test_a_loan_is_resumed_when_its_owner_is_restored_undecided(tmp_path: Path) -> None:
    """An owner's holder restored before the pod watch listed (an owner that booked a share in a listed
    namespace) still holds the card for the loan the previous agent made: the loan is resumed."""
    world = World(tmp_path, PODS)

    async def body() -> None:
        first = world.started()
        idle_owner(world)
        await first.step()
        assert set(first.loans) == {0}
        world.monitor.hold(CARD0, replace(holder("owner", 100), undecided=True), state=DeviceState.FREE)
        again = world.started()
        assert set(again.loans) == {0}

    run(body)
