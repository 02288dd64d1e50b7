"""Resource groups: scopes, reserved cards, type matching and best fit at group level."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core.card_scope import CardSet
from gpupool.core.groups import Group, choose_group, group_rows, outside_scope, scope_of, scoped
from gpupool.core.model import GpuKind, GpuRequest, Placement
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from tests.core.builders import book_slice, make_node, pod_with, slice_pod


def nodes(*names: str) -> frozenset[str]:
    return frozenset(names)


def test_best_fit_picks_the_group_whose_remainder_minus_demand_is_smallest() -> None:
    state = ClusterState([make_node("a", 2), make_node("b", 2), make_node("c", 1)])
    roomy = Group("roomy", CardSet(nodes("a", "b")))
    snug = Group("snug", CardSet(nodes("c")))
    book_slice(state, "x/held", "c", 0, compute=400, memory=1_000)
    choice = choose_group(state, slice_pod("x/p", 500), [roomy, snug])
    assert choice.group == snug  # 600 free - 500 asked beats 4000 - 500
    choice = choose_group(state, slice_pod("x/p", 700), [roomy, snug])
    assert choice.group == roomy
    assert choice.refused == {"snug": "no node of resource group snug can hold the pod now"}


def test_type_matching_keeps_only_groups_with_cards_of_the_requested_model_and_kind() -> None:
    state = ClusterState([make_node("a", 2, model="T4"), make_node("v", 2, model="A100", kind=GpuKind.VIRTUAL)])
    t4 = Group("t4", CardSet(nodes("a")))
    virtual = Group("vgpu", CardSet(nodes("v")))
    choice = choose_group(state, slice_pod("x/p", 100, models=["A100"]), [t4, virtual])
    assert choice.group == virtual
    assert choice.refused == {"t4": "resource group t4 has no GPU of the requested type"}
    physical = pod_with("x/q", GpuRequest(compute=100, memory_mib=None, kind=GpuKind.PHYSICAL))
    assert choose_group(state, physical, [t4, virtual]).group == t4


def test_ties_go_to_the_first_name_and_no_fit_means_no_group() -> None:
    state = ClusterState([make_node("a", 1), make_node("b", 1)])
    pair = [Group("zeta", CardSet(nodes("a"))), Group("alpha", CardSet(nodes("b")))]
    assert choose_group(state, slice_pod("x/p", 100), pair).group == pair[1]
    choice = choose_group(state, slice_pod("x/p", 1_000, count=2), pair)
    assert choice.group is None and set(choice.refused) == {"zeta", "alpha"}


def test_unshared_groups_reserve_their_cards_and_shared_ones_do_not() -> None:
    reserved = Group("r", CardSet(nodes("a"), frozenset({"GPU-b-0"})))
    open_group = Group("o", CardSet(uuids=frozenset({"GPU-b-1"})), shared=True)
    state = ClusterState([make_node("a", 1), make_node("b", 2)])
    assert outside_scope([open_group]) is None
    outside = outside_scope([reserved, open_group])
    assert outside is not None
    assert state.scope_mask(outside)[:, :2].tolist() == [[False, False], [False, True]]
    assert group_rows(state, reserved).tolist() == [0, 1]


def test_scoped_narrows_every_gpu_request_and_keeps_an_earlier_scope() -> None:
    first = Group("g", CardSet(nodes("a")))
    second = Group("h", CardSet(nodes("a", "b")))
    pod = scoped(scoped(slice_pod("x/p", 100), first.scope), second.scope)
    scope = scope_of(pod)
    assert scope is not None and scope.within == (first.cards, second.cards)
    assert scope.label == "resource group g and resource group h"


GROUP_NODES = [f"n{i}" for i in range(4)]


@st.composite
def groups(draw: st.DrawFn) -> list[Group]:
    found = []
    for i in range(draw(st.integers(1, 3))):
        whole = frozenset(draw(st.lists(st.sampled_from(GROUP_NODES), max_size=2)))
        uuids = frozenset(draw(st.lists(st.sampled_from([f"GPU-{n}-{c}" for n in GROUP_NODES for c in range(3)]),
                                        max_size=5)))
        found.append(Group(f"g{i}", CardSet(whole, uuids), shared=draw(st.booleans())))
    return found


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups(), st.lists(st.tuples(st.integers(-1, 2), st.sampled_from([100, 300, 600, 1_000]),
                                    st.integers(1, 2)), max_size=25))
def test_a_pod_never_lands_on_a_gpu_outside_its_group(found: list[Group],
                                                       pods: list[tuple[int, int, int]]) -> None:
    """Pods of random (overlapping, shared or not) groups and pods without a group are scheduled on
    random nodes: every slice of a group's pod is on a card of its group, and no pod without a group
    gets a card an unshared group reserves."""
    state = ClusterState([make_node(name, 3) for name in GROUP_NODES])
    scheduler = Scheduler(state, make_policy("gpupool"))
    outside = outside_scope(found)
    for i, (which, milli, count) in enumerate(pods):
        group = found[which] if 0 <= which < len(found) else None
        pod = scoped(slice_pod(f"t/p{i}", milli, count=count), group.scope if group else outside)
        decision = scheduler.schedule(pod)
        if not isinstance(decision, Placement):
            continue
        for assignment in decision.containers:
            for card in assignment.cards:
                uuid = f"GPU-{decision.node}-{card}"
                if group is not None:
                    assert group.cards.holds(decision.node, uuid)
                else:
                    assert not any(g.cards.holds(decision.node, uuid) for g in found if not g.shared)
