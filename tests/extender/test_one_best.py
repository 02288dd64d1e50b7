"""``gpupool/extender/node_ranking.py``: the fixed node order the filter's one best node is taken in,
and which pods keep every best node (soft preferences).

The order must be the same on every call and every replica (a hash of the name, cached per ledger
layout). The next pod, filtered before the last one's bind, sees that pod's assumed booking in the
ledger (tests/extender/test_assumed_bookings.py), so the order skips nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpupool.core.state import ClusterState
from gpupool.extender.node_ranking import PREFERRED, TieRanks, has_soft_preferences, stable_rank
from tests.core.builders import make_node

NAMES = ("node-a", "node-b", "node-c", "node-d")
RANK = {"node-a": 30, "node-b": 10, "node-c": 40, "node-d": 20}
"""A known order for the tests: b, d, a, c."""


def ledger(names: tuple[str, ...] = NAMES) -> ClusterState:
    return ClusterState([make_node(name) for name in names])


def rows_of(state: ClusterState, *names: str) -> np.ndarray:
    return np.array([state.index[name] for name in names], dtype=np.int64)


# ------------------------------------------------------------------------------- stable_rank
def test_stable_rank_is_the_same_on_every_call_and_tells_names_apart() -> None:
    names = [f"node-{i}" for i in range(200)]
    ranks = [stable_rank(name) for name in names]
    assert ranks == [stable_rank(name) for name in names]
    assert len(set(ranks)) == len(names)
    assert all(0 <= r < np.iinfo(np.int64).max for r in ranks)  # fits the int64 rank array


def test_stable_rank_is_not_the_alphabetical_order() -> None:
    """A hash, so that the names' own order (node-001, node-002, ...) does not fill one rack first."""
    names = sorted(f"node-{i:03d}" for i in range(50))
    assert sorted(names, key=stable_rank) != names


# ------------------------------------------------------------------------------- TieRanks
def test_ranks_follow_the_rows_of_the_ledger() -> None:
    state = ledger()
    ranks = TieRanks(RANK.__getitem__).ranks(state)
    assert ranks.dtype == np.int64
    assert {spec.name: int(ranks[row]) for row, spec in enumerate(state.specs)} == RANK


def test_ranks_are_cached_per_ledger_and_layout_and_rebuilt_when_a_node_is_added() -> None:
    asked: list[str] = []

    def rank_of(name: str) -> int:
        asked.append(name)
        return stable_rank(name)

    ties = TieRanks(rank_of)
    state = ledger()
    first = ties.ranks(state)
    assert ties.ranks(state) is first and sorted(asked) == sorted(NAMES)  # same layout: the same array
    state.add_nodes([make_node("node-e")])
    grown = ties.ranks(state)
    assert grown is not first and len(grown) == len(NAMES) + 1
    assert int(grown[state.index["node-e"]]) == stable_rank("node-e")
    assert sorted(asked) == sorted([*NAMES, "node-e"])  # a known name's rank is not worked out again
    other = ledger((*NAMES, "node-e"))  # another ledger at the same layout version: not the cached rows
    assert other.layout_version == state.layout_version and ties.ranks(other) is not grown


@pytest.mark.parametrize(("rows", "first"), [
    pytest.param(("node-a", "node-b", "node-c", "node-d"), "node-b", id="lowest-rank"),
    pytest.param(("node-c", "node-a"), "node-a", id="lowest-among-the-rows-given"),
    pytest.param(("node-c",), "node-c", id="one-row"),
])
def test_first_takes_the_lowest_rank(rows: tuple[str, ...], first: str) -> None:
    state = ledger()
    assert rows[TieRanks(RANK.__getitem__).first(state, rows_of(state, *rows))] == first


# ------------------------------------------------------------------------------- soft preferences
TERM = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
NODE_TERM = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}


def with_spec(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [], **spec}}


def spread(when: str) -> dict[str, Any]:
    return {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": when,
            "labelSelector": {"matchLabels": {"app": "x"}}}


@pytest.mark.parametrize(("pod", "soft"), [
    pytest.param(with_spec(affinity={"nodeAffinity": {PREFERRED: [{"weight": 1, "preference": NODE_TERM}]}}),
                 True, id="preferred-node-affinity"),
    pytest.param(with_spec(affinity={"podAffinity": {PREFERRED: [{"weight": 5, "podAffinityTerm": TERM}]}}),
                 True, id="preferred-pod-affinity"),
    pytest.param(with_spec(affinity={"podAntiAffinity": {PREFERRED: [{"weight": 5, "podAffinityTerm": TERM}]}}),
                 True, id="preferred-pod-anti-affinity"),
    pytest.param(with_spec(topologySpreadConstraints=[spread("DoNotSchedule"), spread("ScheduleAnyway")]),
                 True, id="spread-schedule-anyway"),
    pytest.param(with_spec(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [NODE_TERM]},
        PREFERRED: [{"weight": 1, "preference": NODE_TERM}]}}), True, id="required-and-preferred"),
    pytest.param(with_spec(topologySpreadConstraints=[spread("DoNotSchedule")]), False, id="spread-do-not-schedule"),
    pytest.param(with_spec(affinity={
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [NODE_TERM]}},
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TERM]},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [TERM]}}),
        False, id="required-affinity-only"),
    pytest.param(with_spec(affinity={"nodeAffinity": {PREFERRED: []}}), False, id="empty-preferred-list"),
    pytest.param(with_spec(nodeSelector={"zone": "a"}), False, id="node-selector-only"),
    pytest.param(with_spec(), False, id="plain-pod"),
    pytest.param({"metadata": {"name": "p"}}, False, id="no-spec"),
    pytest.param(None, False, id="no-pod-object"),
    pytest.param({"spec": "nonsense"}, False, id="spec-not-an-object"),
    pytest.param(with_spec(affinity=["nodeAffinity"]), False, id="affinity-not-an-object"),
    pytest.param(with_spec(affinity={"nodeAffinity": "preferred"}), False, id="node-affinity-not-an-object"),
    pytest.param(with_spec(topologySpreadConstraints={"whenUnsatisfiable": "ScheduleAnyway"}), False,
                 id="spread-not-a-list"),
    pytest.param(with_spec(topologySpreadConstraints=["ScheduleAnyway", None]), False, id="spread-items-not-objects"),
])
def test_has_soft_preferences(pod: dict[str, Any] | None, soft: bool) -> None:
    assert has_soft_preferences(pod) is soft
