"""The agent's Allocate check of a borrower (``LoanedCapacity.vouch``, the lending part the agent is built with):
the core's lent rule against the loans now and the borrowers kubelet lists, by NVML index.

Before issue 22 the node checked each slice's memory against the loan's alone and, when that
failed, checked the borrower against its owners' room instead; the extender books a borrower on
the loan only, so now a borrower that does not fit its loan is refused with the reason.
"""

from __future__ import annotations

import pytest

from gpupool.api.lending import LendableCard
from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, Placement, Topology
from gpupool.nodeagent.gpu_inventory import GpuInventory
from gpupool.nodeagent.lending.setup import borrower_check
from gpupool.nodeagent.schedule_check import AssignmentRefused, CardStateRefused
from gpupool.nodeagent.types import NodeAssignment, PodView

CARDS = (GpuCard(1, "GPU-1", "T4", 16384), GpuCard(3, "GPU-3", "T4", 16384, healthy=False),
         GpuCard(4, "GPU-4", "T4", 16384))
INVENTORY = GpuInventory(CARDS, Topology.flat(3), ("/dev/nvidia1", "/dev/nvidia3", "/dev/nvidia4"))
LOANS = [LendableCard(4, "GPU-4", "default/owner", "main", 8192, 50, 0.0),
         LendableCard(3, "GPU-3", "default/owner", "main", 8192, 50, 0.0)]


def pod(name: str, card: int, mib: int, compute: int = 0, terminated: bool = False) -> PodView:
    """A pod on node-a whose container ``main`` holds ``mib`` and ``compute`` of NVML card ``card``."""
    slices = (CardSlice(card, mib, compute),)
    placement = Placement(f"default/{name}", "node-a", 0, 0, (ContainerAssignment("main", slices),))
    return PodView("default", name, f"uid-{name}", "node-a", 0.0, terminated, (),
                   assignment=NodeAssignment(placement, {card: f"GPU-{card}"}, pod_uid=f"uid-{name}"))


def check(new: PodView, *listed: PodView, borrowers: frozenset[str] | None = None) -> bool:
    names = borrowers if borrowers is not None else frozenset({new.name, *(p.name for p in listed)})
    vouch = borrower_check("node-a", lambda: INVENTORY, lambda: [new, *listed], lambda p: p.name in names,
                           lambda: LOANS)
    assert new.assignment is not None
    return vouch(new, new.assignment.placement.containers[0])


def test_a_borrower_within_the_loan_beside_the_others_is_vouched_for() -> None:
    assert check(pod("b1", 4, 4096, 200), pod("b0", 4, 4096, 300))


def test_a_pod_that_does_not_borrow_is_left_to_the_owners_check() -> None:
    assert not check(pod("o", 1, 4096), borrowers=frozenset())


def test_owners_and_finished_borrowers_do_not_count_against_the_loan() -> None:
    assert check(pod("b1", 4, 8192), pod("owner", 4, 16384), pod("gone", 4, 8192, terminated=True),
                 borrowers=frozenset({"b1", "gone"}))


@pytest.mark.parametrize(("new", "others", "message"), [
    pytest.param(pod("b1", 4, 4096), [pod("b0", 4, 6144)],
                 "card 4 (GPU-4) lent by default/owner would be over-lent: 4096 MiB asked, 6144 MiB of the "
                 "loan's 8192 MiB already granted to default/b0", id="borrowers-over-fill-the-loan-memory"),
    pytest.param(pod("b1", 4, 1024, 600), [],
                 "card 4 (GPU-4) lent by default/owner would be over-lent: 60 % compute asked, 0 % of the "
                 "loan's 50 % already granted to no other pod", id="over-the-loan-compute"),
    pytest.param(pod("b1", 1, 1024), [], "card 1 (GPU-1) on node node-a is not lent now", id="card-not-lent"),
])
def test_a_borrower_over_its_loan_is_refused_naming_the_card_amounts_and_borrowers(
        new: PodView, others: list[PodView], message: str) -> None:
    with pytest.raises(AssignmentRefused) as refused:
        check(new, *others)
    assert str(refused.value) == message


def test_a_borrower_on_an_unhealthy_or_missing_card_is_a_stale_view_of_the_cards() -> None:
    with pytest.raises(CardStateRefused, match="card 3 \\(GPU-3\\) on node node-a is unhealthy"):
        check(pod("b1", 3, 1024))
    with pytest.raises(CardStateRefused, match="card 0 is not on node node-a \\(it has \\[1, 3, 4\\]\\)"):
        check(pod("b1", 0, 1024))
