"""API objects → the plugin's ledger: what each pod holds, and what could not be read."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.cluster_settings import DEFAULT_UNCONFIRMED_TIMEOUT_S
from gpupool.kubectl.snapshot import build_snapshot
from tests.kubectl.objects import NAMES, NOW, allocated, assignment, dra_claim, gpu_node, gpu_pod, placed

NODE = "gpu-a"


def booked_mib(pods: list[dict[str, Any]], *, now: float = NOW.timestamp(),
               leave_out: frozenset[str] = frozenset()) -> list[int]:
    snapshot = build_snapshot([gpu_node(NODE, [16384, 16384])], pods, NAMES, now=now, leave_out=leave_out)
    return [u.memory_total - u.memory_free for u in snapshot.state.card_usage(NODE)]


def test_a_bound_pod_holds_the_card_its_assignment_names() -> None:
    assert booked_mib([placed("a", NODE, 1, 8)]) == [0, 2048]


LATE = DEFAULT_UNCONFIRMED_TIMEOUT_S + 1
"""Seconds after the assignment's time: past the extender's unconfirmed timeout."""


@pytest.mark.parametrize("pod, after_s, expected", [
    pytest.param(placed("done", NODE, 0, 8) | {"status": {"phase": "Succeeded"}}, 1, [0, 0], id="finished"),
    pytest.param(gpu_pod("fresh", 8, annotations=assignment(NODE, 0, 2048)), 1, [2048, 0],
                 id="assigned-bind-in-flight"),
    pytest.param(gpu_pod("late", 8, annotations=assignment(NODE, 0, 2048)), LATE, [0, 0], id="assigned-timed-out"),
    pytest.param(gpu_pod("confirmed", 8, annotations=assignment(NODE, 0, 2048) | allocated(NODE)), LATE,
                 [2048, 0], id="assigned-confirmed-never-times-out"),
    pytest.param(placed("bound", NODE, 0, 8), LATE, [2048, 0], id="bound-never-times-out"),
    pytest.param(gpu_pod("pending", 8), 1, [0, 0], id="pending-without-assignment"),
])
def test_what_a_pod_holds(pod: dict[str, Any], after_s: float, expected: list[int]) -> None:
    assert booked_mib([pod], now=NOW.timestamp() + after_s) == expected


def test_an_unbound_assignment_holds_for_the_clusters_unconfirmed_timeout() -> None:
    """The plugin counts an unbound assignment as long as the extender does: the cluster's
    unconfirmedTimeout (docs/cluster-config.md), not a default of its own."""
    pod = gpu_pod("late", 8, annotations=assignment(NODE, 0, 2048))

    def booked(timeout_s: float, after_s: float) -> list[int]:
        snapshot = build_snapshot([gpu_node(NODE, [16384, 16384])], [pod], NAMES, now=NOW.timestamp() + after_s,
                                  unconfirmed_timeout_s=timeout_s)
        return [u.memory_total - u.memory_free for u in snapshot.state.card_usage(NODE)]
    assert booked(600.0, LATE) == [2048, 0]
    assert booked(600.0, 601) == [0, 0]
    assert booked(60.0, 61) == [0, 0]


def test_an_assignment_not_bound_yet_is_marked_as_a_bind_in_flight() -> None:
    pods = [gpu_pod("fresh", 8, annotations=assignment(NODE, 0, 2048)), placed("a", NODE, 1, 4)]
    snapshot = build_snapshot([gpu_node(NODE, [16384, 16384])], pods, NAMES, now=NOW.timestamp())
    assert snapshot.unbound == {"team/fresh"}


def test_the_pod_left_out_holds_nothing() -> None:
    assert booked_mib([placed("a", NODE, 1, 8)], leave_out=frozenset({"team/a"})) == [0, 0]


def test_a_bound_pod_with_an_unreadable_assignment_holds_its_cpu_and_refuses_the_node() -> None:
    broken = gpu_pod("broken", 8, node=NODE, phase="Running", cpu="3", annotations={NAMES.assignment: "{not json"})
    snapshot = build_snapshot([gpu_node(NODE, [16384])], [broken], NAMES, now=NOW.timestamp())
    assert "team/broken" in snapshot.pod_problems
    assert "cannot read" in snapshot.node_problems[NODE]
    assert int(snapshot.state.cpu_free[snapshot.state.index[NODE]]) == 16000 - 3000


def test_an_assignment_naming_an_unknown_card_refuses_the_node() -> None:
    stale = gpu_pod("stale", 8, node=NODE, phase="Running", annotations=assignment(NODE, 5, 2048))
    snapshot = build_snapshot([gpu_node(NODE, [16384])], [stale], NAMES, now=NOW.timestamp())
    assert "no card 5" in snapshot.node_problems[NODE]


def test_a_node_with_a_broken_inventory_has_no_cards_and_says_why() -> None:
    node = gpu_node(NODE, [16384])
    node["metadata"]["annotations"][NAMES.inventory] = '{"v":1,"cards":"many"}'
    snapshot = build_snapshot([node], [], NAMES, now=NOW.timestamp())
    assert snapshot.state.card_usage(NODE) == []
    assert "inventory-v1" in snapshot.node_problems[NODE]


def test_over_committed_claims_are_booked_not_dropped() -> None:
    pods = [placed("a", NODE, 0, 40), placed("b", NODE, 0, 40)]
    snapshot = build_snapshot([gpu_node(NODE, [16384])], pods, NAMES, now=NOW.timestamp())
    assert snapshot.state.over_capacity(NODE) == (0,)


def test_dra_claims_of_gpupools_driver_hold_their_cards_beside_the_pods() -> None:
    """As the extender books them (gpupool.kube.claim_holding): a claim's shares on the node its
    pool names, a whole card for a claim that consumed no capacity, other drivers' claims nothing."""
    claims = [dra_claim("c", "a", memory="4Gi", compute="30"), dra_claim("w", "a", card=1),
              dra_claim("nic", "a", memory="4Gi", driver="nic.example.com")]
    snapshot = build_snapshot([gpu_node("a", [16384, 16384])], [placed("p", "a", 0, 8)], NAMES,
                              now=NOW.timestamp(), claims=claims)
    assert [int(f) for f in snapshot.state.card_mem_free[0][:2]] == [16384 - 2048 - 4096, 0]
    assert set(snapshot.state.placements) == {"team/p", "team/claim:c", "team/claim:w"}
    assert not snapshot.node_problems and not snapshot.pod_problems


def test_a_claim_that_cannot_be_booked_refuses_its_node_with_the_extenders_reason() -> None:
    snapshot = build_snapshot([gpu_node("a", [16384])], [], NAMES, now=NOW.timestamp(),
                              claims=[dra_claim("c", "a", card=3, memory="4Gi")])
    assert "device gpu-3 is not among node a's cards" in snapshot.pod_problems["team/claim:c"]
    assert snapshot.node_problems["a"].startswith("pod team/claim:c is bound to this node with an assignment "
                                                  "gpupool cannot read (claim team/c: device gpu-3")
