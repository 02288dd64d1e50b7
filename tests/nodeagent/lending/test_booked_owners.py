"""An owner booked on a lent card that does not hold it (seed 000, case A: an arriving owner is never
starved by a borrower). The extender books owners against the card and borrowers against the loan
(two budgets, gpupool/core/lent.py), so an extended-resource pod may be booked on a card whose idle
owner lends it: one whose container has not started when the card goes idle, or one placed there
after the loan began. Such a container is no owner the loan names: nothing watched it and its
allocations had no wait bound, so its first allocation could fail while borrowers held its room.
Now its share is never lent, a loan it arrives on shrinks once, the borrowers past the shrunk loan are
reclaimed, and it waits for room from the moment Allocate creates its region."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpupool.api.annotations import Assignment, CardRef, ContainerCards, encode_assignment
from gpupool.api.lending import decode_lendable
from gpupool.nodeagent.containers.container_gate import ContainerGate
from gpupool.nodeagent.isolation.shim_files import create_region
from gpupool.nodeagent.lending.checkpoint import CheckpointEnforcement, CheckpointStore
from gpupool.nodeagent.lending.over_loan import BorrowerOnCard, reclaim_to_fit
from gpupool.nodeagent.lending.pods import lending_pod
from gpupool.nodeagent.lending.region_control import OWNER_WAIT_MARGIN_S
from gpupool.nodeagent.monitor.events import Verdict
from gpupool.nodeagent.monitor.usage_state import DeviceState, ProcessIdentity
from gpupool.nodeagent.types import GrantExtras, PodView
from gpupool.shim.region import DEVICE, DEVICES_OFFSET, WAIT, WAIT_OFFSET, read_region
from tests.nodeagent.containers.test_container_gate import RecordingGate
from tests.nodeagent.lending.regions import MIB, region_path, write_region
from tests.nodeagent.lending.support import CARD_MIB, LEND, NAMES, WHEN, decoded, holder, pod_json
from tests.nodeagent.lending.world import CARD0, PODS, World, idle_owner, open_, run, settle

BOUND_NS = int((1 + OWNER_WAIT_MARGIN_S) * 1e9)
"""The owners' wait bound in the lending world (checkpoint deadline 1 s)."""


def booked(name: str, memory_mib: int, compute: int = 300, *, card: int = 0, init: str = "",
           started: bool = True, phase: str = "Running") -> dict[str, Any]:
    """A pod whose container ``c`` is booked ``memory_mib`` and ``compute`` per mille of ``card`` (and an
    init container ``init`` the same share, when named)."""
    obj = pod_json(name)
    containers = [ContainerCards("c", (CardRef(card, f"GPU-{card}", memory_mib, compute),))]
    if init:
        containers.insert(0, ContainerCards(init, (CardRef(card, f"GPU-{card}", memory_mib, compute),), init=True))
        obj["spec"]["initContainers"] = [{"name": init}]
        obj["status"]["initContainerStatuses"] = [{"name": init, "containerID": f"containerd://id-{name}-init"}]
    obj["metadata"]["annotations"][NAMES.assignment] = encode_assignment(Assignment("n1", WHEN, tuple(containers)))
    if not started:
        obj["status"]["containerStatuses"] = [{"name": "c"}]
    obj["status"]["phase"] = phase
    return obj


def wait_of(path: Path, ordinal: int = 0) -> int:
    """The wait bound in a region, initialised by the library or still the zero-filled file Allocate created."""
    return int(WAIT.unpack_from(path.read_bytes(), DEVICES_OFFSET + ordinal * DEVICE.size + WAIT_OFFSET)[0])


def arrive(world: World, obj: dict[str, Any]) -> None:
    """The pod watch delivers a new pod bound to the node."""
    [pod] = decoded(obj)
    world.pods.on_event("ADDED", pod)


def test_an_owner_booked_on_the_card_but_not_holding_it_is_never_lent(tmp_path: Path) -> None:
    """The idle owner holds 2 GiB of card 0; "newcomer" is booked 6 GiB, 25 % there and has not opened
    it. The loan leaves its share out (before: 14 GiB and 100 %, the newcomer's share lent)."""
    world = World(tmp_path, [*PODS, booked("newcomer", 6144, 250, started=False)])

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        [loan] = service.loans.values()
        assert loan.owners == frozenset({("ns", "owner", "c")})
        assert (loan.memory_mib, loan.compute_percent) == (CARD_MIB - 2048 - 6144, 75)
        assert loan.kept_bookings == frozenset({("uid-newcomer", "c")})
        await service.publisher.publish_now()
        [card] = decode_lendable(world.api.annotations[-1] or "").cards
        assert (card.memory_mib, card.compute_percent) == (CARD_MIB - 2048 - 6144, 75)

    run(body)


def test_a_whole_card_booking_not_held_lends_nothing(tmp_path: Path) -> None:
    obj = booked("newcomer", CARD_MIB, 1000)
    notes = obj["metadata"]["annotations"]
    notes[NAMES.assignment] = encode_assignment(Assignment("n1", WHEN, (ContainerCards(
        "c", (CardRef(0, "GPU-0", CARD_MIB, 1000, exclusive=True),)),)))
    world = World(tmp_path, [*PODS, obj])

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        assert service.loans == {}

    run(body)


def test_what_a_pod_may_still_open_is_kept_and_what_it_never_will_is_lent(tmp_path: Path) -> None:
    """An init container's share counts only until an app container was created, and an ended pod's
    never: neither will open the card again, so keeping their share would only lend less."""
    waiting = lending_pod(decoded(booked("w", 4096, init="setup", started=False))[0], LEND)
    running = lending_pod(decoded(booked("r", 4096, init="setup"))[0], LEND)
    done = lending_pod(decoded(booked("d", 4096, phase="Succeeded"))[0], LEND)
    assert waiting is not None and running is not None and done is not None
    assert set(waiting.shares) == {"setup", "c"}
    assert set(running.shares) == {"c"}
    assert done.shares == {}
    world = World(tmp_path, [*PODS, booked("d", 4096, phase="Succeeded")])

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        assert service.loans[0].memory_mib == CARD_MIB - 2048

    run(body)


def test_an_owner_placed_on_a_lent_card_shrinks_the_loan_once_at_once_and_across_a_restart(tmp_path: Path) -> None:
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        assert service.loans[0].memory_mib == CARD_MIB - 2048
        await service.publisher.publish_now()
        arrive(world, booked("newcomer", 4096, 250))  # the borrower's 4 GiB still fit what is left
        await service.step()
        loan = service.loans[0]
        assert (loan.memory_mib, loan.compute_percent) == (CARD_MIB - 2048 - 4096, 75)
        assert service.publisher.due_in() == 0, "a smaller offer is written at once, as a withdrawal is"
        await service.publisher.publish_now()
        assert decode_lendable(world.api.annotations[-1] or "").cards[0].memory_mib == CARD_MIB - 2048 - 4096
        saved = json.loads((tmp_path / "lending.json").read_text())["loans"][0]
        assert saved["bookingsKept"] == [["uid-newcomer", "c"]]
        await service.step()
        assert service.loans[0] == loan, "an owner is left out once, not again at every step"
        again = world.started()  # a restarted agent resumes the shrunk loan, the newcomer already left out
        await again.step()
        assert again.loans[0] == loan
        assert world.api.evicted == [], "the borrower's 4 GiB fit the shrunk loan: nobody is reclaimed"

    run(body)


def test_borrowers_past_a_loan_shrunk_for_an_arriving_owner_are_reclaimed_as_for_a_returning_owner(
        tmp_path: Path) -> None:
    """The borrower holds 4 GiB of the 14 GiB loan; an owner booked 12 GiB arrives: the loan shrinks to
    2 GiB, below the borrower's booking, so the borrower is frozen at once, signalled and evicted."""
    world = World(tmp_path, PODS)
    state = tmp_path / "state"
    borrower = write_region(state, "uid-borrower", {0: (4000, 50)})

    async def body() -> None:
        service = world.started(shim_state_dir=str(state))
        idle_owner(world)
        await service.step()
        world.processes.alive = {200: "id-borrower"}
        assert service.decide(open_(200)) is Verdict.ALLOW
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
        arrive(world, booked("newcomer", 12288, 300))
        await service.step()
        assert service.loans[0].memory_mib == CARD_MIB - 2048 - 12288, "the loan stays, shrunk"
        frozen = read_region(borrower).devices[0]
        assert frozen.memory_limit_bytes == frozen.used_bytes == 4000 * MIB, "frozen before any signal"
        await settle(service)
        assert [pid for pid, _ in world.processes.sent] == [200]
        assert world.api.evicted == [("ns", "borrower")]

    run(body)


def test_a_booked_owner_waits_for_room_while_the_card_is_lent_and_from_its_grant(tmp_path: Path) -> None:
    """The loan's owner waited before; now so does every owner booked on the card: one whose region
    exists when the card is lent, and one placed later, whose region Allocate creates (its wait is
    written in the grant, before its container can start). Once the card is the owners' again, no
    wait: a full card fails at once."""
    world = World(tmp_path, [*PODS, booked("early", 2048, 100, started=False)])
    state = tmp_path / "state"
    early = write_region(state, "uid-early", {0: (0, 0)})

    class Backend:  # the interception library's backend: Allocate creates the container's region
        def grant_extras(self, pod: PodView, container: str) -> Any:
            path = region_path(state, pod.uid, container)
            path.parent.mkdir(parents=True, exist_ok=True)
            create_region(str(path))
            return GrantExtras()

    async def body() -> None:
        service = world.started(shim_state_dir=str(state))
        enforcement = CheckpointEnforcement(Backend(), CheckpointStore(str(tmp_path / "ckpt"), 1), world.pods.get)  # type: ignore[arg-type]
        enforcement.granted = service.owner_granted
        idle_owner(world)
        await service.step()
        assert read_region(early).devices[0].wait_ns == BOUND_NS
        late = booked("late", 4096, 200)
        arrive(world, late)
        [view] = decoded(late)
        assert isinstance(view.view, PodView)
        enforcement.grant_extras(view.view, "c")  # Allocate, before any step
        assert wait_of(region_path(state, "uid-late", "c")) == BOUND_NS, "written before its container starts"
        assert service.loans[0].memory_mib == CARD_MIB - 2048 - 2048 - 4096, "shrunk in the grant"
        world.monitor.hold(CARD0, holder("owner", 100), state=DeviceState.BUSY)
        service.decide(open_(101))  # the loan's owner is back: the loan ends
        await settle(service)
        await service.step()
        assert read_region(early).devices[0].wait_ns == 0
        assert wait_of(region_path(state, "uid-late", "c")) == 0

    run(body)


def lent_to(name: str, memory_mib: int, compute: int, *, priority: int | None = None) -> dict[str, Any]:
    """A borrower of card 0's loan booked ``memory_mib`` and ``compute`` per mille there."""
    obj = booked(name, memory_mib, compute)
    obj["metadata"]["annotations"].update({LEND.borrowed: "true", LEND.borrowed_from: "ns/owner"})
    if priority is not None:
        obj["spec"]["priority"] = priority
    return obj


def borrower_of(name: str, memory_mib: int, compute: int = 100, since: float | None = None) -> BorrowerOnCard:
    return BorrowerOnCard(("ns", name), 0, memory_mib, compute, since)


def test_the_victims_are_the_lowest_priority_then_the_least_work_lost_then_the_largest() -> None:
    """Priority first, then a borrower not holding the card, then the youngest holder, then the largest;
    a victim whose booking fits back once later victims are taken is spared."""
    young, old = borrower_of("young", 4096, since=500.0), borrower_of("old", 4096, since=100.0)
    vip = BorrowerOnCard(("ns", "vip"), 500, 1024, 100, None)
    assert reclaim_to_fit([old, young, vip], 12288, 1000) == ()
    assert reclaim_to_fit([old, young, vip], 8192, 1000) == (("ns", "young"),)
    assert reclaim_to_fit([old, young, vip], 4096, 1000) == (("ns", "young"), ("ns", "old"))
    assert reclaim_to_fit([old, young, vip], 8192, 150) == (("ns", "young"), ("ns", "old")), "compute counts too"
    small, large = borrower_of("small", 1024), borrower_of("large", 6144)
    assert reclaim_to_fit([small, large], 6144, 1000) == (("ns", "large"),), "the largest first among equals"
    waiting = borrower_of("waiting", 1024)
    assert reclaim_to_fit([waiting, old], 1024, 1000) == (("ns", "old"),), \
        "taken first (it loses nothing), the waiting one is spared: the old one alone frees enough"
    assert reclaim_to_fit([old, young], 0, 0) == (("ns", "young"), ("ns", "old")), "a whole-card owner: all"


def test_a_loan_shrunk_below_its_borrowers_reclaims_only_enough_of_them_in_the_documented_order(
        tmp_path: Path) -> None:
    """The 14 GiB loan holds four borrowers, 14 GiB together; an owner booked 6 GiB arrives (the loan
    shrinks to 8 GiB). 'waiting' (not holding the card: nothing lost) and 'young' (the youngest holder)
    go; 'old' and 'vip' (higher spec.priority, though younger still) keep running. Before: all four went."""
    borrowers = [lent_to("old", 4096, 200), lent_to("young", 4096, 200), lent_to("waiting", 2048, 100),
                 lent_to("vip", 4096, 200, priority=500)]
    world = World(tmp_path, [*PODS[:1], *borrowers])
    for pid, name in ((600, "old"), (700, "young"), (800, "vip")):
        world.identities[pid] = ProcessIdentity(f"id-{name}", "c", name, "ns")
        world.processes.alive[pid] = f"id-{name}"

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        assert service.loans[0].memory_mib == 4 * 4096 - 2048 == CARD_MIB - 2048
        world.monitor.hold(CARD0, holder("owner", 100), holder("old", 600, since=100.0),
                           holder("young", 700, since=500.0), holder("vip", 800, since=600.0),
                           state=DeviceState.IDLE)
        arrive(world, booked("newcomer", 6144, 250))
        await service.step()
        assert (service.loans[0].memory_mib, service.loans[0].compute_percent) == (8192, 75)
        await settle(service)
        assert sorted(world.api.evicted) == [("ns", "waiting"), ("ns", "young")]
        assert [pid for pid, _ in world.processes.sent] == [700]
        await service.step()
        await settle(service)
        assert sorted(world.api.evicted) == [("ns", "waiting"), ("ns", "young")], "the rest fit: they stay"

    run(body)


def test_an_owner_whose_share_the_loan_left_out_opens_the_card_without_reclaiming_borrowers_that_fit(
        tmp_path: Path) -> None:
    """The newcomer's 4 GiB were left out of the loan when it arrived; the borrower's 4 GiB fit what is
    left. Its first open (and the borrower's next one, behind the kernel's gate) reclaims no one.
    Before: the open was rule 1 against the borrower, reclaimed though it fit."""
    world = World(tmp_path, PODS)
    world.identities[900] = ProcessIdentity("id-newcomer", "c", "newcomer", "ns")
    kernel = RecordingGate()
    gate = ContainerGate(kernel, {f"id-{n}": f"/k8s.io/{n}" for n in ("owner", "borrower", "newcomer")}.get)

    async def body() -> None:
        service = world.started(gate=gate)
        idle_owner(world)
        await service.step()
        world.processes.alive = {200: "id-borrower", 900: "id-newcomer"}
        assert service.decide(open_(200)) is Verdict.ALLOW
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
        arrive(world, booked("newcomer", 4096, 250))
        await service.step()
        assert service.loans[0].kept_bookings == frozenset({("uid-newcomer", "c")})
        assert service.decide(open_(900)) is Verdict.ALLOW
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), holder("newcomer", 900),
                           state=DeviceState.IDLE)
        service.on_open(CARD0, holder("newcomer", 900))
        assert "id-borrower" not in service.refusals(), "the borrower may open the card beside it"
        assert kernel.denied == set()
        assert service.decide(open_(201)) is Verdict.ALLOW
        await service.step()
        await settle(service)
        assert world.api.evicted == [] and world.processes.sent == []
        assert service.reclaiming == frozenset() and 0 in service.loans

    run(body)


def test_a_returning_owner_whose_share_was_lent_still_reclaims_every_borrower_rule_1(tmp_path: Path) -> None:
    """Beside an owner whose share was left out (its open spared the borrower), the loan's own owner
    opens the card: its share was lent, so rule 1 as before: the borrower goes and the loan ends."""
    world = World(tmp_path, PODS)
    world.identities[900] = ProcessIdentity("id-newcomer", "c", "newcomer", "ns")

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        world.processes.alive = {200: "id-borrower", 900: "id-newcomer"}
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), state=DeviceState.IDLE)
        arrive(world, booked("newcomer", 4096, 250))
        await service.step()
        assert service.decide(open_(900)) is Verdict.ALLOW
        await settle(service)
        assert world.api.evicted == []
        world.monitor.hold(CARD0, holder("owner", 100), holder("borrower", 200), holder("newcomer", 900),
                           state=DeviceState.IDLE)
        assert service.decide(open_(101)) is Verdict.ALLOW
        await settle(service)
        assert world.api.evicted == [("ns", "borrower")]
        assert service.loans == {}

    run(body)


def test_a_borrower_placed_against_the_larger_offer_that_arrives_after_the_shrink_is_reclaimed(
        tmp_path: Path) -> None:
    """The loan shrank to 10 GiB for the newcomer; the borrower's 4 GiB fit. 'late' (8 GiB), placed
    against the 14 GiB offered before, arrives now: the next step reclaims it alone (the newcomer's
    open would not: it does not judge the loan's borrowers)."""
    world = World(tmp_path, PODS)

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        arrive(world, booked("newcomer", 4096, 250))
        await service.step()
        assert service.loans[0].memory_mib == CARD_MIB - 2048 - 4096
        arrive(world, lent_to("late", 8192, 200))
        await service.step()
        await settle(service)
        assert world.api.evicted == [("ns", "late")]

    run(body)
