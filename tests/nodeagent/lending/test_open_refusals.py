"""The lending rules' refusals precomputed for the kernel's gate (seed 000, claims 1 and 7, cases A
and C): who the gate is told to refuse, when, and that an owner never is."""

from __future__ import annotations

from pathlib import Path

from gpupool.nodeagent.containers.container_gate import ContainerGate
from gpupool.nodeagent.monitor.usage_state import DeviceState
from tests.nodeagent.containers.test_container_gate import RecordingGate
from tests.nodeagent.lending.support import decoded, holder
from tests.nodeagent.lending.world import CARD0, PODS, World, idle_owner, open_, run, settle

CGROUPS = {f"id-{name}": f"/k8s.io/{name}" for name in ("owner", "borrower", "owner1", "borrower1", "other")}


def gated(world: World) -> tuple[ContainerGate, RecordingGate]:
    kernel = RecordingGate()
    return ContainerGate(kernel, CGROUPS.get), kernel


def test_case_c_a_borrower_beside_a_busy_owner_is_refused_the_card_before_it_asks(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)
    gate, kernel = gated(world)

    async def body() -> None:
        service = world.started(gate=gate)
        service.on_open(CARD0, holder("owner", 100))  # the owner's open, as the monitor records it
        world.monitor.hold(CARD0, holder("owner", 100))
        assert service.refusals() == {"id-borrower": {CARD0}}
        service.refuse_now()
        assert kernel.denied == {("/k8s.io/borrower", CARD0)}
        await settle(service)
        assert world.api.evicted == [("ns", "borrower")], "the refused asker is reclaimed, as rule 3 says"
        world.pods.on_event("DELETED", *decoded(PODS[1]))
        world.monitor.hold(CARD0)  # the owner closed the card
        await service.step()
        assert kernel.denied == set(), "nobody holds it: nothing is refused"

    run(body)


def test_case_a_an_owner_is_never_refused_and_its_borrower_is_once_it_returns(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)
    gate, kernel = gated(world)

    async def body() -> None:
        service = world.started(gate=gate)
        idle_owner(world)
        await service.step()  # lent
        world.processes.alive = {200: "id-borrower"}
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
        service.refuse_now()
        assert kernel.denied == set(), "the owner lent it: its borrower may open it, and the owner may"
        service.decide(open_(101))  # the owner is back: rule 1
        service.refuse_now()
        assert kernel.denied == {("/k8s.io/borrower", CARD0)}, "a pod being reclaimed opens nothing more"
        assert all(cgroup != "/k8s.io/owner" for _, cgroup, _ in kernel.calls)
        await settle(service)
        assert world.api.evicted == [("ns", "borrower")]
        world.monitor.hold(CARD0, holder("owner", 100))
        await service.step()
        assert kernel.denied == {("/k8s.io/borrower", CARD0)}, "still beside its busy owner: rule 3"
        world.pods.on_event("DELETED", *decoded(PODS[1]))  # evicted: gone from the watch
        await service.step()
        assert kernel.denied == set()

    run(body)


def test_pods_without_the_card_in_their_assignment_are_not_judged(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)
    gate, kernel = gated(world)

    async def body() -> None:
        service = world.started(gate=gate)
        world.monitor.hold(CARD0, holder("owner", 100))
        await service.step()
        assert "id-borrower1" not in service.refusals() and "id-other" not in service.refusals()
        assert kernel.denied == {("/k8s.io/borrower", CARD0)}

    run(body)


def test_without_a_gate_nothing_changes(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        world.monitor.hold(CARD0, holder("owner", 100))
        service.refuse_now()
        await service.step()
        assert service.gate is None

    run(body)
