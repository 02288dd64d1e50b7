"""The node's check before Allocate agrees with the extender on a virtual card (one card as n
devices): it holds the card's total for the container, exactly as the core booked it."""

from __future__ import annotations

import pytest

from gpupool.core.cards import assign_on_node
from gpupool.core.model import CardSlice, ContainerAssignment, GpuCard, GpuRequest, Placement, VirtualCards
from gpupool.core.state import ClusterState
from tests.core.builders import pod_with
from tests.nodeagent.test_node_ledger_agrees import NODE, World, extender_verdict, node_verdict, spec

CARDS = (GpuCard(2, "GPU-2", "T4", 16_384), GpuCard(5, "GPU-5", "T4", 16_384))


def on(pos: int, memory: int, compute: int = 0, *, devices: int = 1, exclusive: bool = False,
       key: str = "default/new") -> Placement:
    piece = CardSlice(pos, memory, compute, exclusive, devices=devices)
    return Placement(key, NODE, 0, 0, (ContainerAssignment("c0", (piece,)),))


def world(owners: tuple[Placement, ...], pod: Placement) -> World:
    return World(CARDS, owners, (), (), pod, False)


@pytest.mark.parametrize(("owners", "pod", "fits"), [
    pytest.param((), on(1, 8_192, 400, devices=2), True, id="two-devices-on-an-empty-card"),
    pytest.param((on(1, 8_192, key="default/o"),), on(1, 8_192, devices=2), True, id="fills-the-card"),
    pytest.param((on(1, 8_193, key="default/o"),), on(1, 8_192, devices=2), False, id="over-the-card-memory"),
    pytest.param((on(1, 1_024, key="default/o"),), on(1, 16_384, 1_000, devices=2, exclusive=True), False,
                 id="exclusive-on-a-used-card"),
    pytest.param((), on(1, 16_384, 1_000, devices=2, exclusive=True), True, id="exclusive-on-an-idle-card"),
])
def test_the_node_and_the_extender_agree(owners: tuple[Placement, ...], pod: Placement, fits: bool) -> None:
    case = world(owners, pod)
    assert (extender_verdict(case) is None) == fits
    assert (node_verdict(case) is None) == fits


def test_the_core_choice_is_granted_by_the_node() -> None:
    owner = on(1, 4_096, key="default/o")
    state = ClusterState([spec(world((), owner))])
    state.claim(owner)
    request = GpuRequest(count=2, memory_mib=6_144, virtual=VirtualCards.SHARED)
    chosen = assign_on_node(state, 0, pod_with("default/new", request, cpu=0, memory=0))
    assert isinstance(chosen, Placement)
    assert chosen.containers[0].slices[0].devices == 2
    case = world((owner,), chosen)
    assert extender_verdict(case) is None and node_verdict(case) is None
