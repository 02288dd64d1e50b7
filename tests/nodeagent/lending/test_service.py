"""The lending service: loans of idle cards, the rules at opens, reclaim and the faults of issue 13."""

from __future__ import annotations

import json
from pathlib import Path

from gpupool.api.lending import decode_lendable
from gpupool.nodeagent.monitor.events import Verdict
from gpupool.nodeagent.monitor.usage_state import DeviceState, ProcessIdentity
from tests.nodeagent.lending.support import LEND, NAMES, decoded, holder, pod_json
from tests.nodeagent.lending.world import CARD0, CARD1, PODS, World, idle_owner, open_, run, settle


def test_an_idle_card_is_lent_published_and_advertised(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        assert service.device_list(NAMES.gpu_mem) == []
        idle_owner(world)
        await service.step()
        [loan] = service.loans.values()
        assert (loan.card, loan.memory_mib, loan.owners) == (0, 16384 - 2048, frozenset({("ns", "owner", "c")}))
        mem = service.device_list(NAMES.gpu_mem)
        assert len(mem) == (16384 - 2048) // 256 and mem[0] == ("lend-g0-m0", True)
        assert len(service.device_list(NAMES.gpu_core)) == 100 and service.device_list(NAMES.gpu) == []
        assert world.device_bumps == 1
        await service.publisher.publish_now()
        [card] = decode_lendable(world.api.annotations[-1] or "").cards
        assert (card.owner, card.owner_container, card.memory_mib) == ("ns/owner", "c", 14336)

    run(body)


def test_the_owner_returning_reclaims_the_borrower_once_and_withdraws_the_devices(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        assert service.decide(open_(200)) is Verdict.ALLOW  # the borrower: the owner lent it
        world.processes.alive = {200: "id-borrower", 201: "id-borrower"}
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
        assert service.decide(open_(101)) is Verdict.ALLOW  # the owner again: rule 1
        assert service.loans == {} and ("ns", "borrower") in service.reclaiming
        assert service.decide(open_(102)) is Verdict.ALLOW  # while the reclaim runs
        assert service.decide(open_(202)) is Verdict.DENY  # the borrower is refused meanwhile
        await settle(service)
        assert world.api.evicted == [("ns", "borrower")]  # one reclaim, not three
        assert sorted(world.processes.sent) == [(200, "SIGUSR1"), (201, "SIGUSR1")]
        assert service.device_list(NAMES.gpu_mem) == [] and world.api.annotations[-1] is None
        assert service.reclaiming == frozenset()

    run(body)


def test_a_borrower_under_criu_run_gets_the_checkpoint_signal_at_its_containers_process_1_only(
        tmp_path: Path) -> None:
    """``gpupool.io/checkpoint: process``: criu-run (the container's process 1) dumps the workload; the
    workload's own processes are not signalled (they would end before the dump); the dump ends them."""
    pods = [pod_json("owner", cards=(0,)),
            pod_json("borrower", borrowed_from="ns/owner", cards=(0,), annotations={LEND.checkpoint: "process"})]
    world = World(tmp_path, pods)

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        assert service.decide(open_(201)) is Verdict.ALLOW
        world.processes.alive = {200: "id-borrower", 201: "id-borrower"}
        world.processes.container_inits = {200}
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 201), state=DeviceState.IDLE)
        assert service.decide(open_(101)) is Verdict.ALLOW
        await settle(service)
        assert world.processes.sent == [(200, "SIGUSR1")]  # not 201, the workload holding the card
        assert world.api.evicted == [("ns", "borrower")]

    run(body)


def test_a_borrower_opening_a_card_that_is_not_lent_is_refused_and_stopped(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        world.monitor.hold(CARD0, holder("owner", 100))  # busy: not lent
        world.processes.alive = {200: "id-borrower"}
        service.on_open(CARD0, holder("borrower", 200))  # the /proc scan: enforced by stopping it
        await settle(service)
        assert world.api.evicted == [("ns", "borrower")] and world.processes.sent == [(200, "SIGUSR1")]

    run(body)


def test_a_restarted_agent_resumes_the_loan(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        first = world.started()
        idle_owner(world)
        await first.step()
        assert json.loads((tmp_path / "lending.json").read_text())["loans"][0]["card"] == 0
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.BUSY)
        again = world.started()  # the agent restarted: the card is busy with the borrower now
        assert set(again.loans) == {0} and again.device_list(NAMES.gpu_mem)
        assert again.decide(open_(201)) is Verdict.ALLOW  # the dormant owner still does not refuse it
        world.processes.alive = {200: "id-borrower"}
        assert again.decide(open_(101)) is Verdict.ALLOW
        await settle(again)
        assert world.api.evicted == [("ns", "borrower")]

    run(body)


def test_a_loan_whose_owner_stopped_holding_is_not_resumed(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        first = world.started()
        idle_owner(world)
        await first.step()
        world.monitor.hold(CARD0, holder("borrower", 200))
        again = world.started()
        assert again.loans == {}

    run(body)


def test_two_owners_idle_at_once_get_their_own_cards_back(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        idle_owner(world, CARD1, "owner1", 300)
        await service.step()
        assert set(service.loans) == {0, 1}
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
        world.monitor.hold(CARD1, holder("owner1", 300), holder("borrower1", 400), state=DeviceState.IDLE)
        world.processes.alive = {200: "id-borrower", 400: "id-borrower1"}
        assert service.decide(open_(101)) is Verdict.ALLOW
        await settle(service)
        assert world.api.evicted == [("ns", "borrower")] and set(service.loans) == {1}
        assert service.device_list(NAMES.gpu_mem)[0][0] == "lend-g1-m0"
        assert decode_lendable(world.api.annotations[-1] or "").cards[0].index == 1

    run(body)


def test_no_loan_while_a_high_priority_pod_without_a_share_holds_the_card(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        world.monitor.hold(CARD0, holder("owner", 100), holder("other", 500), state=DeviceState.IDLE)
        world.monitor.sample({})
        await service.step()
        assert service.loans == {}

    run(body)


def test_a_loan_ends_when_its_owner_leaves_the_node(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        world.pods.on_event("DELETED", *decoded(PODS[0]))
        await service.step()
        assert service.loans == {}

    run(body)


def test_recorded_priorities(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)
    service = world.service()
    assert service.priority_of(ProcessIdentity("id-other", "c", "other", "ns"), CARD0) == 1
    assert service.priority_of(ProcessIdentity("id-borrower", "c", "borrower", "ns"), CARD0) == 0
    assert service.priority_of(ProcessIdentity(), CARD0) is None



