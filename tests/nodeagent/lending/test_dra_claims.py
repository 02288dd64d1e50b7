"""Lending knows DRA claims (issue 24): a container that uses a prepared claim is booked on the claim's
cards as on an assignment's, so its pod is an owner like any other (lent while idle, its borrowers
reclaimed when it returns), and a prepared claim that no container holding the card uses is never
lent. The claims come from a real :class:`ClaimState`, prepared through kubelet's call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpupool.api.lending import decode_lendable
from gpupool.core.model import CardSlice
from gpupool.nodeagent.dra.cdi import CdiSpecs
from gpupool.nodeagent.dra.claim_allocation import ClaimRef
from gpupool.nodeagent.dra.claim_state import ClaimState
from gpupool.nodeagent.lending.options import ActivityThresholds
from gpupool.nodeagent.lending.pods import lending_pod, with_claims
from gpupool.nodeagent.lending.region_control import OWNER_WAIT_MARGIN_S
from gpupool.nodeagent.lending.rules import Rule
from gpupool.nodeagent.monitor.events import Verdict
from gpupool.nodeagent.monitor.usage_state import DeviceState, ProcessIdentity
from gpupool.shim.region import read_region
from tests.nodeagent.dra.test_one_ledger_agrees import DRIVER, NODE, claim
from tests.nodeagent.lending.regions import write_region
from tests.nodeagent.lending.support import CARD_MIB, LEND, NAMES, decoded, holder, inventory, pod_json
from tests.nodeagent.lending.world import CARD0, PODS, World, idle_owner, open_, run, settle, tick

DRA_PID = 600
"""The claim pod's processes: 600, 601, ... (the world's resolver is told who they are)."""


def dra_pod(name: str = "drapod", claim_name: str = "gpu-claim", priority: int | None = None) -> dict[str, Any]:
    """A pod whose container ``c`` uses the ResourceClaim ``claim_name`` (no extended resource)."""
    obj = pod_json(name, priority=priority)
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    obj["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return obj


class Claims:
    """The DRA driver's claim state on the lending world's two 16 GiB cards."""

    def __init__(self, tmp: Path) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.state = ClaimState(NODE, DRIVER, lambda: inventory(), self.read, CdiSpecs(str(tmp / "cdi"), "gpupool.io"),
                                str(tmp / "claims.json"))

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get(name)

    async def prepare(self, name: str, shares: list[tuple[int, int | None, int]]) -> None:
        obj = claim(name, shares)
        self.objects[name] = obj
        ref = ClaimRef("ns", name, obj["metadata"]["uid"])
        answer = (await self.state.prepare([ref]))[ref.uid]
        assert not isinstance(answer, str), answer


def world_with_claims(tmp: Path, *pods: dict[str, Any]) -> tuple[World, Claims]:
    world = World(tmp, [*PODS, *pods])
    claims = Claims(tmp)
    world.pods.use_claims(claims.state.as_pods)
    for i in range(10):
        world.identities[DRA_PID + i] = ProcessIdentity("id-drapod", "c", "drapod", "ns")
    return world, claims


def test_a_prepared_claim_no_container_holds_yet_is_never_lent(tmp_path: Path) -> None:
    """The owner idles on card 0 beside a 6 GiB, 30 % claim whose pod has not opened the card: the loan
    leaves the claim's memory and compute out (without claims it offered 14 GiB and 100 %)."""
    world, claims = world_with_claims(tmp_path, dra_pod())

    async def body() -> None:
        await claims.prepare("gpu-claim", [(0, 6144, 30)])
        service = world.started()
        idle_owner(world)  # 2 GiB used on the card
        await service.step()
        [loan] = service.loans.values()
        assert (loan.memory_mib, loan.compute_percent) == (CARD_MIB - 2048 - 6144, 70)
        assert loan.kept == frozenset({("ns", "gpu-claim")})
        assert len(service.device_list(NAMES.gpu_mem)) == (CARD_MIB - 2048 - 6144) // 256
        assert len(service.device_list(NAMES.gpu_core)) == 70
        await service.publisher.publish_now()
        [card] = decode_lendable(world.api.annotations[-1] or "").cards
        assert (card.memory_mib, card.compute_percent) == (8192, 70)

    run(body)


def test_a_whole_card_claim_not_held_lends_nothing_of_the_card(tmp_path: Path) -> None:
    world, claims = world_with_claims(tmp_path, dra_pod())

    async def body() -> None:
        await claims.prepare("gpu-claim", [(0, None, 0)])
        service = world.started()
        idle_owner(world)
        await service.step()
        assert service.loans == {}

    run(body)


def test_a_claim_prepared_on_a_lent_card_shrinks_the_loan_and_a_restart_keeps_it(tmp_path: Path) -> None:
    world, claims = world_with_claims(tmp_path, dra_pod())

    async def body() -> None:
        service = world.started()
        idle_owner(world)
        await service.step()
        assert service.loans[0].memory_mib == CARD_MIB - 2048
        await service.publisher.publish_now()
        await claims.prepare("gpu-claim", [(0, 4096, 25)])
        await service.step()
        loan = service.loans[0]
        assert (loan.memory_mib, loan.compute_percent) == (CARD_MIB - 2048 - 4096, 75)
        assert service.publisher.due_in() == 0, "a smaller offer is written at once, as a withdrawal is"
        await service.publisher.publish_now()
        assert decode_lendable(world.api.annotations[-1] or "").cards[0].memory_mib == CARD_MIB - 2048 - 4096
        saved = json.loads((tmp_path / "lending.json").read_text())["loans"][0]
        assert saved["claimsKept"] == [["ns", "gpu-claim"]]
        await service.step()
        assert service.loans[0] == loan, "a claim is kept out once, not again at every step"
        again = world.started()  # an agent restart resumes the shrunk loan, the claim already left out
        await again.step()
        assert again.loans[0] == loan

    run(body)


def test_an_idle_claim_pod_lends_like_an_owner_and_its_return_reclaims_the_borrower(tmp_path: Path) -> None:
    """The claim's pod (low priority) holds card 0 idle: it is the loan's owner and lends what it does not
    use; when it opens the card again it is rule 1. Without claims it was an unbooked low holder facing
    a low borrower: rule 4, the borrower kept the memory the claim's container holds."""
    world, claims = world_with_claims(tmp_path, dra_pod(), pod_json("claim-borrower", borrowed_from="ns/drapod",
                                                                    cards=(0,)))
    world.identities[700] = ProcessIdentity("id-claim-borrower", "c", "claim-borrower", "ns")

    async def body() -> None:
        await claims.prepare("gpu-claim", [(0, 8192, 50)])
        service = world.started()
        world.monitor.hold(CARD0, holder("drapod", DRA_PID), state=DeviceState.IDLE)
        world.monitor.sample({0: 1024})
        await service.step()
        [loan] = service.loans.values()
        assert loan.owners == frozenset({("ns", "drapod", "c")}) and loan.kept == frozenset()
        # the claim's unused 7 GiB is lent; the world's pod "owner" is booked 4 GiB, 30 % on card 0 without
        # holding it, and an owner the loan does not name is never lent (test_booked_owners.py)
        assert (loan.memory_mib, loan.compute_percent) == (CARD_MIB - 1024 - 4096, 70), \
            "an owner's unused share is lent"
        assert service.decide(open_(700)) is Verdict.ALLOW  # the borrower: the claim's pod lent it
        world.processes.alive = {700: "id-claim-borrower"}
        world.monitor.hold(CARD0, holder("drapod", DRA_PID), holder("claim-borrower", 700), state=DeviceState.IDLE)
        assert service.decide(open_(DRA_PID + 1)) is Verdict.ALLOW  # the claim's container opens it again
        [(_, decision)] = service.decisions
        assert decision.rule is Rule.RECLAIM_LOW_HOLDER and decision.reclaim == (("ns", "claim-borrower"),)
        assert service.loans == {}
        await settle(service)
        assert world.api.evicted == [("ns", "claim-borrower")]

    run(body)


def test_a_high_priority_claim_pod_holding_its_card_idle_lends_it(tmp_path: Path) -> None:
    """Booked on its claim's card, a high-priority pod is an owner; without claims it was a high
    holder with no share of the card, which bars every loan (rule 3 would refuse the borrower)."""
    world, claims = world_with_claims(tmp_path, dra_pod(priority=2000))

    async def body() -> None:
        await claims.prepare("gpu-claim", [(0, 4096, 30)])
        service = world.started()
        world.monitor.hold(CARD0, holder("drapod", DRA_PID), state=DeviceState.IDLE)
        world.monitor.sample({0: 512})
        await service.step()
        assert service.loans[0].owners == frozenset({("ns", "drapod", "c")})

    run(body)


def test_a_claim_owner_waits_in_its_claims_region_and_its_activity_there_ends_the_loan(tmp_path: Path) -> None:
    """The grant of a claim is the claim's: its library region is ``<pod-uid>_<claim>``, where the owner's
    wait bound is written and its activity read (at the card's ordinal in the claim)."""
    world, claims = world_with_claims(tmp_path, dra_pod(), pod_json("claim-borrower", borrowed_from="ns/drapod",
                                                                    cards=(1,)))
    state = tmp_path / "state"
    region = write_region(state, "uid-drapod", {0: (0, 0), 1: (1024, 0)}, container="gpu-claim")

    async def body() -> None:
        await claims.prepare("gpu-claim", [(0, 2048, 10), (1, 4096, 20)])
        service = world.started(ActivityThresholds(percent=10, memory_mib=256, samples=2), str(state))
        world.monitor.hold("/dev/nvidia1", holder("drapod", DRA_PID), state=DeviceState.IDLE)
        world.monitor.sample({1: 1024})
        await service.step()
        assert set(service.loans) == {1}
        assert read_region(region).devices[1].wait_ns == int((1 + OWNER_WAIT_MARGIN_S) * 1e9)
        assert read_region(region).devices[0].wait_ns == 0, "card 0 is not lent"
        world.processes.alive = {700: "id-claim-borrower"}
        world.monitor.hold("/dev/nvidia1", holder("drapod", DRA_PID), holder("claim-borrower", 700),
                           state=DeviceState.IDLE)
        write_region(state, "uid-drapod", {0: (0, 0), 1: (1024, 90)}, container="gpu-claim")
        tick(world, util={1: 95})
        await service.step()
        assert set(service.loans) == {1}, "not yet: two active samples in a row"
        tick(world, util={1: 95})
        await service.step()
        assert service.loans == {}
        [(_, decision)] = service.decisions
        assert decision.rule is Rule.RECLAIM_LOW_HOLDER and decision.reclaim == (("ns", "claim-borrower"),)
        await settle(service)
        assert world.api.evicted == [("ns", "claim-borrower")]

    run(body)


def test_a_containers_claims_are_booked_with_their_regions_and_an_unprepared_claim_books_nothing() -> None:
    """Cards and regions per claim: the grant (and the library's region) is the claim's, its CUDA
    ordinals the claim's cards in order; a claim not prepared on this node books nothing."""
    obj = dra_pod()
    obj["spec"]["resourceClaims"] += [{"name": "more", "resourceClaimName": "second"},
                                      {"name": "gone", "resourceClaimName": "elsewhere"}]
    obj["spec"]["containers"][0]["resources"]["claims"] += [{"name": "more"}, {"name": "gone"}]
    slices = {("ns", "gpu-claim"): (CardSlice(1, 1024, 100), CardSlice(0, 1024, 100)),
              ("ns", "second"): (CardSlice(0, 2048, 0),)}
    [node_pod] = decoded(obj)
    raw = lending_pod(node_pod, LEND)
    assert raw is not None and raw.claims == {"c": ("gpu-claim", "second", "elsewhere")} and raw.booked == {}
    pod = with_claims(raw, slices)
    assert pod.booked == {"c": frozenset({0, 1})} and pod.cards == {"c": (1, 0)}
    assert pod.region("c", 0) == ("gpu-claim", 1) and pod.region("c", 1) == ("gpu-claim", 0)
    assert pod.region("c", 2) is None and pod.region("other", 0) is None
    assert with_claims(raw, {}).booked == {}
