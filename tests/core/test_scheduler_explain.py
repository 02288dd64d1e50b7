"""Scheduler.explain: reasons remembered per request and node, and forgotten when the node changes."""

from __future__ import annotations

import pytest

import gpupool.core.scheduler as scheduler_module
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from tests.core.builders import book_slice, make_node, mem_pod, rows


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = scheduler_module.explain_node

    def counting(state: ClusterState, row: int, pod: object) -> str | None:
        calls.append(row)
        return original(state, row, pod)  # type: ignore[arg-type]

    monkeypatch.setattr(scheduler_module, "explain_node", counting)
    return calls


def test_reasons_are_reused_for_other_pods_of_the_same_request(counted: list[int]) -> None:
    state = ClusterState([make_node(n, [16_384]) for n in ("a", "b", "c")])
    book_slice(state, "x", "a", 0, memory=12_000)
    book_slice(state, "y", "b", 0, memory=10_000)
    scheduler = Scheduler(state, make_policy("binpack"))
    expected = {"a": "no single card has 8000 MiB free; largest free 4384 MiB",
                "b": "no single card has 8000 MiB free; largest free 6384 MiB"}
    assert scheduler.explain(mem_pod("p1", 8_000), rows(0, 1, 2)) == expected
    assert counted == [0, 1, 2]
    assert scheduler.explain(mem_pod("p2", 8_000), rows(0, 1, 2)) == expected  # another pod, same ask
    assert counted == [0, 1, 2]
    scheduler.explain(mem_pod("p3", 9_000), rows(0,))  # a different request is explained afresh
    assert counted == [0, 1, 2, 0]


def test_a_node_that_changed_is_explained_again(counted: list[int]) -> None:
    state = ClusterState([make_node(n, [16_384]) for n in ("a", "b")])
    book_slice(state, "x", "a", 0, memory=12_000)
    book_slice(state, "y", "b", 0, memory=12_000)
    scheduler = Scheduler(state, make_policy("binpack"))
    scheduler.explain(mem_pod("p", 8_000), rows(0, 1))
    book_slice(state, "z", "a", 0, memory=1_000)
    state.release("y")
    reasons = scheduler.explain(mem_pod("p", 8_000), rows(0, 1))
    assert reasons == {"a": "no single card has 8000 MiB free; largest free 3384 MiB"}  # b fits now
    assert counted == [0, 1, 0, 1]
    state.upsert_node(make_node("a", [32_768]))
    assert scheduler.explain(mem_pod("p", 8_000), rows(0,)) == {}
