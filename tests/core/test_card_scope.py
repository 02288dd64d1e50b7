"""Card scopes: groups, pins and avoided cards or models, through the one card rule."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.core.card_scope import MASKS_KEPT, CardScope, CardSet, ScopeMasks
from gpupool.core.cards import assign_on_node
from gpupool.core.feasibility import explain_node, node_fit_mask
from gpupool.core.groups import scoped
from gpupool.core.model import CardSlice, GpuRequest, Placement
from gpupool.core.state import ClusterState
from tests.core.builders import make_node, raw_placement, slice_pod

GROUP = CardScope("resource group g", (CardSet(frozenset({"a"}), frozenset({"GPU-b-1"})),))


def cluster() -> ClusterState:
    return ClusterState([make_node("a", 2), make_node("b", 2, model="B"), make_node("c", 2)])


@pytest.mark.parametrize(("scope", "admitted"), [
    pytest.param(GROUP, {("a", 0), ("a", 1), ("b", 1)}, id="group-by-node-and-uuid"),
    pytest.param(CardScope("pins", (CardSet(uuids=frozenset({"GPU-c-0"})),)), {("c", 0)}, id="pinned-uuid"),
    pytest.param(CardScope("avoid", avoid=CardSet(uuids=frozenset({"GPU-a-0"}))),
                 {("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1)}, id="avoided-uuid"),
    pytest.param(CardScope("models", avoid_models=frozenset({"A"})), {("b", 0), ("b", 1)}, id="avoided-model"),
    pytest.param(GROUP.narrowed(CardScope("no B", avoid_models=frozenset({"B"}))), {("a", 0), ("a", 1)},
                 id="group-narrowed-by-model"),
    pytest.param(CardScope("unknown", (CardSet(uuids=frozenset({"GPU-zz"})),)), set(), id="unknown-uuid"),
    pytest.param(CardScope("words", model_words=(frozenset({"b"}),)), {("b", 0), ("b", 1)},
                 id="model-word-any-case"),
    pytest.param(CardScope("no word", avoid_model_words=frozenset({"a"})), {("b", 0), ("b", 1)},
                 id="avoided-model-word"),
    pytest.param(CardScope("w1", model_words=(frozenset({"A", "B"}),)).narrowed(
        CardScope("w2", model_words=(frozenset({"B"}),))), {("b", 0), ("b", 1)}, id="every-set-of-words-must-match"),
])
def test_mask_admits_exactly_what_the_plain_rule_admits(scope: CardScope, admitted: set[tuple[str, int]]) -> None:
    state = cluster()
    mask = state.scope_mask(scope)
    found = {(state.specs[r].name, int(c)) for r, c in zip(*np.nonzero(mask), strict=True)}
    assert found == admitted
    for spec in state.specs:
        for card in spec.cards:
            assert scope.admits(spec.name, card.uuid, card.model) == ((spec.name, card.index) in admitted)


def test_filter_explanation_chooser_and_ledger_keep_a_pod_in_its_scope() -> None:
    state = cluster()
    pod = scoped(slice_pod("ns/p", 500), GROUP)
    assert node_fit_mask(state, pod).tolist() == [True, True, False]
    assert explain_node(state, 2, pod) == ("no healthy card of the requested kind within resource group g "
                                           "on this node")
    placement = assign_on_node(state, 1, pod)
    assert isinstance(placement, Placement)
    assert placement.containers[0].cards == (1,)  # card 0 of b is outside the group
    outside = raw_placement("ns/q", "b", [CardSlice(0, 100, 100)])
    assert state.check(outside, GROUP) == "node b card 0 is outside the cards the pod may use"
    assert state.check(outside) is None  # the scope is the request's, not the card's


def test_masks_follow_a_node_replaced_with_other_cards() -> None:
    state = cluster()
    scope = CardScope("pins", (CardSet(uuids=frozenset({"GPU-new-0"})),))
    assert not state.scope_mask(scope).any()
    state.upsert_node(make_node("new", 1))
    assert state.scope_mask(scope)[state.index["new"]].tolist()[:1] == [True]


def test_the_memo_keeps_a_bounded_number_of_masks() -> None:
    state = cluster()
    masks = ScopeMasks()
    scopes = [CardScope(f"s{i}", avoid_models=frozenset({f"M{i}"})) for i in range(MASKS_KEPT + 5)]
    first = masks.mask(state, scopes[0])
    assert masks.mask(state, scopes[0]) is first
    for scope in scopes[1:]:
        masks.mask(state, scope)
    assert masks.mask(state, scopes[0]) is not first  # pushed out, built again
    assert not first.flags.writeable


def test_a_scoped_request_is_a_different_shape_for_the_scheduler_caches() -> None:
    plain = GpuRequest(compute=300, memory_mib=None)
    assert plain != scoped(slice_pod("p", 300), GROUP).containers[0].gpu
    assert hash(scoped(slice_pod("p", 300), GROUP)) == hash(scoped(slice_pod("p", 300), GROUP))
