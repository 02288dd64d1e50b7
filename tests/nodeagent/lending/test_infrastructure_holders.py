"""Lending beside host daemons (issues 26/27): nvidia-persistenced or DCGM holding a card does not keep an
idle owner's card from being lent; a host process nobody named infrastructure still does. The same for
an infrastructure pod (issue 26): the GPU Operator's DCGM exporter, a system-node-critical DaemonSet's
pod that booked no GPU in a namespace the admin listed, is neither a bar (rule 3), nor an owner, nor
reclaimed; the same pod not named infrastructure (another namespace) bars lending as before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpupool.nodeagent.monitor.events import Verdict
from gpupool.nodeagent.monitor.usage_state import DeviceState, Holder, ProcessIdentity
from tests.nodeagent.lending.support import holder, pod_json
from tests.nodeagent.lending.world import CARD0, PODS, World, open_, run, settle

PERSISTENCED = Holder(pid=50, start_time=50, since=0.0, infrastructure="nvidia-persistenced")
ADMIN_JOB = Holder(pid=51, start_time=51, since=0.0)
"""A host process in no pod, not named infrastructure (an admin's CUDA program)."""
EXPORTER = Holder(pid=60, start_time=60, since=0.0, container_id="id-dcgm-exporter", container="exporter",
                  pod="dcgm-exporter", namespace="gpu-operator", infrastructure="gpu-operator")
"""The GPU Operator's DCGM exporter as the monitor records it in a listed namespace."""
EXPORTER_POD = pod_json("dcgm-exporter", namespace="gpu-operator", container="exporter", priority=2000001000)
"""A system-node-critical DaemonSet's pod: high priority, no gpupool GPU booked."""
WITH_EXPORTER = [*PODS, EXPORTER_POD]


def lend_with(tmp_path: Path, *others: Holder) -> list[int]:
    world = World(tmp_path, WITH_EXPORTER)
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


def test_an_idle_owners_card_that_an_infrastructure_pod_also_holds_is_lent(tmp_path: Path) -> None:
    assert lend_with(tmp_path, EXPORTER) == [0]


def test_the_same_pod_not_named_infrastructure_bars_lending(tmp_path: Path) -> None:
    assert lend_with(tmp_path, replace(EXPORTER, infrastructure="")) == []  # rule 3: high priority, no share


def test_a_borrower_opens_beside_an_infrastructure_pod_and_the_pod_opening_again_reclaims_nobody(
        tmp_path: Path) -> None:
    world = World(tmp_path, WITH_EXPORTER)
    world.identities[EXPORTER.pid] = ProcessIdentity(EXPORTER.container_id, EXPORTER.container, EXPORTER.pod,
                                                     EXPORTER.namespace, EXPORTER.infrastructure)

    async def body() -> None:
        service = world.started()
        world.monitor.hold(CARD0, holder("owner", 100), EXPORTER, state=DeviceState.IDLE)
        world.monitor.sample({0: 2048, 1: 2048})
        await service.step()
        assert set(service.loans) == {0}
        assert service.decide(open_(200)) is Verdict.ALLOW  # the borrower: the exporter is no high holder
        world.processes.alive[200] = "id-borrower"
        world.monitor.hold(CARD0, holder("owner", 100), EXPORTER, holder("borrower", 200), state=DeviceState.IDLE)
        service.on_open(CARD0, holder("borrower", 200))
        assert service.decide(open_(EXPORTER.pid)) is Verdict.ALLOW  # its next poll: a high asker, yet no owner
        service.on_open(CARD0, EXPORTER)
        await service.step()
        await settle(service)
        assert set(service.loans) == {0} and service.reclaiming == frozenset()
        assert world.processes.sent == [] and service.refusals() == {}
        assert service.priority_of(world.identities[EXPORTER.pid], CARD0) is None

    run(body)
