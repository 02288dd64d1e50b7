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
from gpupool.nodeagent.isolation.shim_files import create_region
from gpupool.nodeagent.lending.checkpoint import CheckpointEnforcement, CheckpointStore
from gpupool.nodeagent.lending.pods import lending_pod
from gpupool.nodeagent.lending.region_control import OWNER_WAIT_MARGIN_S
from gpupool.nodeagent.monitor.events import Verdict
from gpupool.nodeagent.monitor.usage_state import DeviceState
from gpupool.nodeagent.types import GrantExtras, PodView
from gpupool.shim.region import DEVICE, DEVICES_OFFSET, WAIT, WAIT_OFFSET, read_region
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
