"""``gpupool/extender/one_best.py``: the fixed node order the filter's one best node is taken in,
the nodes in flight it skips, and which pods keep every best node (soft preferences).

The order must be the same on every call and every replica (a hash of the name, cached per ledger
layout); a node passed alone stays in flight until its pod's bind (or a hold time) so that the next
pod, filtered before that bind, is handed another node.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpupool.core.state import ClusterState
from gpupool.extender.one_best import (
    IN_FLIGHT_S,
    PREFERRED,
    InFlight,
    OneBest,
    TieRanks,
    has_soft_preferences,
    stable_rank,
)
from tests.core.builders import book_whole, make_node

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


@pytest.mark.parametrize(("rows", "skip", "first"), [
    pytest.param(("node-a", "node-b", "node-c", "node-d"), None, "node-b", id="lowest-rank"),
    pytest.param(("node-c", "node-a"), None, "node-a", id="lowest-among-the-rows-given"),
    pytest.param(("node-a", "node-b", "node-c", "node-d"), (), "node-b", id="empty-skip"),
    pytest.param(("node-a", "node-b", "node-c", "node-d"), ("node-b",), "node-d", id="skips-the-first"),
    pytest.param(("node-a", "node-b", "node-c", "node-d"), ("node-b", "node-d", "node-a"), "node-c",
                 id="skips-all-but-one"),
    pytest.param(("node-a", "node-b"), ("node-a", "node-b"), "node-b", id="all-skipped-lowest-rank"),
    pytest.param(("node-a", "node-c"), ("node-b",), "node-a", id="skip-outside-the-rows"),
    pytest.param(("node-c",), ("node-c",), "node-c", id="one-row-skipped"),
])
def test_first_takes_the_lowest_rank_skipping_while_another_row_remains(
        rows: tuple[str, ...], skip: tuple[str, ...] | None, first: str) -> None:
    state = ledger()
    asked = rows_of(state, *rows)
    position = TieRanks(RANK.__getitem__).first(state, asked, None if skip is None else rows_of(state, *skip))
    assert rows[position] == first


# ------------------------------------------------------------------------------- InFlight
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def names_in_flight(flight: InFlight, state: ClusterState) -> dict[str, str]:
    return {state.specs[row].name: pod for row, pod in flight.holders(state).items()}


def test_in_flight_holds_a_passed_node_until_its_pod_is_booked() -> None:
    state, flight = ledger(), InFlight(clock=Clock())
    assert flight.holders(state) == {}
    flight.passed("ns/p1", "node-a")
    flight.passed("ns/p2", "node-c")
    assert names_in_flight(flight, state) == {"node-a": "ns/p1", "node-c": "ns/p2"}
    assert flight.holds("ns/p1", state) and flight.holds("ns/p2", state)
    flight.booked("ns/p1")
    assert names_in_flight(flight, state) == {"node-c": "ns/p2"}
    assert not flight.holds("ns/p1", state)
    flight.booked("ns/unknown")  # a bind of a pod never passed alone: nothing to drop
    flight.booked("ns/p1")  # twice: harmless
    assert names_in_flight(flight, state) == {"node-c": "ns/p2"}


def test_a_pod_the_ledger_books_is_no_longer_in_flight() -> None:
    """The bind's reservation reaches the ledger before the bind returns: from then the ledger
    shows the pod, and the node is the ledger's business again."""
    state, flight = ledger(), InFlight(clock=Clock())
    flight.passed("ns/p1", "node-a")
    flight.passed("ns/p2", "node-b")
    book_whole(state, "ns/p1", "node-a", 0)
    assert names_in_flight(flight, state) == {"node-b": "ns/p2"}
    assert not flight.holds("ns/p1", state) and flight.holds("ns/p2", state)


def test_a_later_filter_of_the_same_pod_replaces_its_node() -> None:
    state, flight = ledger(), InFlight(clock=Clock())
    flight.passed("ns/p", "node-a")
    flight.passed("ns/p", "node-b")
    assert names_in_flight(flight, state) == {"node-b": "ns/p"}


def test_a_node_passed_to_two_pods_stays_in_flight_until_both_are_booked() -> None:
    state, flight = ledger(), InFlight(clock=Clock())
    flight.passed("ns/p1", "node-a")
    flight.passed("ns/p2", "node-a")
    flight.booked("ns/p1")
    assert names_in_flight(flight, state) == {"node-a": "ns/p2"}
    flight.booked("ns/p2")
    assert names_in_flight(flight, state) == {}


def test_in_flight_entries_expire_after_the_hold_time() -> None:
    clock, state = Clock(), ledger()
    flight = InFlight(hold_s=2.0, clock=clock)
    flight.passed("ns/p1", "node-a")
    clock.now += 1.0
    flight.passed("ns/p2", "node-b")
    clock.now += 0.999
    assert names_in_flight(flight, state) == {"node-a": "ns/p1", "node-b": "ns/p2"}
    clock.now += 0.001  # p1's two seconds are over
    assert names_in_flight(flight, state) == {"node-b": "ns/p2"}
    assert not flight.holds("ns/p1", state)
    clock.now += 1.0
    assert names_in_flight(flight, state) == {}


def test_the_default_hold_is_in_flight_s() -> None:
    clock, state = Clock(), ledger()
    flight = InFlight(clock=clock)
    flight.passed("ns/p", "node-a")
    clock.now += IN_FLIGHT_S - 0.01
    assert names_in_flight(flight, state) == {"node-a": "ns/p"}
    clock.now += 0.01
    assert names_in_flight(flight, state) == {}


def test_in_flight_ignores_nodes_the_ledger_does_not_have() -> None:
    """A node removed since it was passed: no row, and no error."""
    state, flight = ledger(), InFlight(clock=Clock())
    flight.passed("ns/p1", "gone")
    flight.passed("ns/p2", "node-d")
    assert names_in_flight(flight, state) == {"node-d": "ns/p2"}


# ------------------------------------------------------------------------------- OneBest
def choose(one: OneBest, state: ClusterState, pod: str, *rows: str) -> tuple[str, str]:
    first, holder = one.choose(state, rows_of(state, *rows), pod)
    return rows[first], holder


def test_choose_skips_the_nodes_in_flight_for_other_pods() -> None:
    state, one = ledger(), OneBest(RANK.__getitem__)
    assert choose(one, state, "ns/p1", *NAMES) == ("node-b", "")
    one.in_flight.passed("ns/p1", "node-b")
    assert choose(one, state, "ns/p2", *NAMES) == ("node-d", "")
    one.in_flight.passed("ns/p2", "node-d")
    assert choose(one, state, "ns/p3", "node-b", "node-d") == ("node-b", "ns/p1")  # all in flight: the first


def test_choose_does_not_keep_a_pod_from_its_own_node() -> None:
    """A pod filtered again (kube-scheduler retrying it) gets the node it was passed, with no one to wait for."""
    state, one = ledger(), OneBest(RANK.__getitem__)
    one.in_flight.passed("ns/p1", "node-b")
    assert choose(one, state, "ns/p1", *NAMES) == ("node-b", "")
    assert choose(one, state, "ns/p1", "node-b") == ("node-b", "")


def test_a_node_held_for_two_pods_is_still_in_flight_for_either() -> None:
    """p2 was passed p1's in-flight node (its only best node then): asked again with another node
    tied, p2 is kept from it as long as p1 holds it, and p1's hold is still seen."""
    state, one = ledger(), OneBest(RANK.__getitem__)
    one.in_flight.passed("ns/p1", "node-b")
    one.in_flight.passed("ns/p2", "node-b")
    assert one.in_flight.holds("ns/p1", state) and one.in_flight.holds("ns/p2", state)
    assert choose(one, state, "ns/p2", "node-b", "node-d") == ("node-d", "")
    assert choose(one, state, "ns/p2", "node-b") == ("node-b", "ns/p1")
    assert choose(one, state, "ns/p1", "node-b", "node-d") == ("node-d", "")


def test_choose_of_a_single_best_node_names_the_pod_holding_it() -> None:
    state, one = ledger(), OneBest(RANK.__getitem__)
    assert choose(one, state, "ns/p2", "node-c") == ("node-c", "")
    one.in_flight.passed("ns/p1", "node-c")
    assert choose(one, state, "ns/p2", "node-c") == ("node-c", "ns/p1")


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
