"""Remote borrowing in the lending replay: a borrower's CPU and memory on a node with room, its slice
on a lent card of another node (the core's remote-share placement), at the network's cost."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.model import NodeSpec
from gpupool.sim.arrivals import ArrivingPod
from gpupool.sim.lending import REMOTE_RATE, _Replay, replay
from gpupool.sim.lending_report import LendingSetup, cpu_only_nodes, run_lending
from gpupool.sim.trace import TracePod
from tests.sim.test_sim_lending import HOUR, node, pod


def cpu_node(name: str = "c0", cpu: int = 32_000) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=cpu, memory_mib=128_000)


def short_of_cpu() -> tuple[list[NodeSpec], list[ArrivingPod]]:
    """The owner keeps 30 of its node's 32 cores and idles from 1 h to 3 h; the waiter needs 8 cores."""
    owner = pod("owner", 0, 4, cpu=30_000, lendable_h=((1, 3),))
    waiter = pod("waiter", 0.5, 1, cpu=8_000)
    return [node("gpu", cpu=32_000), cpu_node("cpu")], [owner, waiter]


def test_a_borrower_short_of_cpu_on_the_owners_node_runs_remotely_at_the_networks_cost() -> None:
    nodes, pods = short_of_cpu()
    outcome = replay(nodes, pods, "gpupool", lending=True, hours=10, remote_borrow=True)
    assert outcome.remote_starts == 1 and outcome.remote_borrowers == 1 and outcome.reclaims == 0
    # 1 h of work at REMOTE_RATE holds the lent card 1 / 0.92 h; the work counted is 1 h
    assert outcome.remote_gpu_hours == pytest.approx(1 / REMOTE_RATE, abs=1e-3)
    assert outcome.borrowed_gpu_hours == pytest.approx(1.0, abs=1e-3)
    assert outcome.finished == 2
    assert outcome.mean_wait_hours == pytest.approx(0.5 / 2)  # the waiter started at 1 h, not at 4 h


def test_without_the_option_the_same_borrower_waits_for_the_owner() -> None:
    nodes, pods = short_of_cpu()
    outcome = replay(nodes, pods, "gpupool", lending=True, hours=10)
    assert outcome.remote_starts == 0 and outcome.remote_borrowers == 0 and outcome.remote_gpu_hours == 0
    assert outcome.borrowed_gpu_hours == 0 and outcome.lends == 1
    assert outcome.mean_wait_hours == pytest.approx(3.5 / 2)


def test_the_slice_goes_local_when_the_owners_node_has_the_cpu() -> None:
    """The core's order: the pod's own cards first; nothing runs remotely when a local borrow fits."""
    owner = pod("owner", 0, 4, cpu=4_000, lendable_h=((1, 3),))
    waiter = pod("waiter", 0.5, 1, cpu=8_000)
    outcome = replay([node("gpu"), cpu_node("cpu")], [owner, waiter], "gpupool", lending=True, hours=10,
                     remote_borrow=True)
    assert outcome.remote_starts == 0 and outcome.borrowed_gpu_hours == pytest.approx(1.0)


def test_no_node_without_gpus_no_remote_borrower() -> None:
    """The cluster's rule: a GPU node runs a remote-share pod only on its own cards."""
    owner = pod("owner", 0, 4, cpu=30_000, lendable_h=((1, 3),))
    waiter = pod("waiter", 0.5, 1, cpu=8_000)
    outcome = replay([node("gpu"), node("gpu2", cards=0)], [owner, waiter], "gpupool", lending=True, hours=10,
                     remote_borrow=True)
    assert outcome.remote_starts == 1  # a node with no cards is a node without GPUs
    full = pod("full", 0, 4, cpu=1_000)  # the second GPU node's card is taken, its CPU free
    outcome = replay([node("gpu"), node("gpu2")], [owner, full, waiter], "gpupool", lending=True, hours=10,
                     remote_borrow=True)
    assert outcome.remote_starts == 0 and outcome.borrowed_gpu_hours == 0


def test_a_reclaim_releases_both_parts_and_keeps_the_remote_progress() -> None:
    """The owner is back at 1.5 h: the remote borrower (0.5 h run, 0.46 h of work) is reclaimed, its
    CPU on the CPU node and its slice on the card released; it resumes when the owner finishes."""
    owner = pod("owner", 0, 4, cpu=30_000, lendable_h=((1, 1.5),))
    waiter = pod("waiter", 0.5, 2, cpu=8_000)
    nodes = [node("gpu"), cpu_node("cpu")]
    at_reclaim = _Replay(nodes, [owner, waiter], "gpupool", lending=True, hours=1.75, seed=42, remote_borrow=True)
    outcome = at_reclaim.run()
    assert outcome.remote_starts == 1 and outcome.reclaims == 1
    cpu_row = at_reclaim.lent.index["cpu"]
    assert at_reclaim.lent.cpu_free[cpu_row] == 32_000 and at_reclaim.lent.mem_free[cpu_row] == 128_000
    assert at_reclaim.lent.release("waiter") is None and at_reclaim.lent.release("waiter#host") is None
    assert at_reclaim.borrowers_on == {"gpu": [], "cpu": []} and not at_reclaim.remote_host
    done = replay(nodes, [owner, waiter], "gpupool", lending=True, hours=10, remote_borrow=True)
    # the rest (2 - 0.5 * 0.92 h) runs on the owner's card once it leaves at 4 h, as a regular pod
    assert done.finished == 2 and done.reclaims == 1
    assert done.allocated_gpu_hours == pytest.approx(4 + 2 - 0.5 * REMOTE_RATE, abs=1e-3)
    assert done.borrowed_gpu_hours == pytest.approx(0.5 * REMOTE_RATE, abs=1e-3)


def test_remote_borrowing_needs_lending() -> None:
    nodes, pods = short_of_cpu()
    with pytest.raises(ValueError, match="needs lending"):
        replay(nodes, pods, "gpupool", lending=False, hours=10, remote_borrow=True)


def test_the_report_compares_with_local_only_lending_on_the_same_cluster() -> None:
    trace = [TracePod(pod(f"t{i}", 0, 1, milli=m, cpu=c).request, 0, 4 * 3600)
             for i, (m, c) in enumerate(((1000, 30_000), (500, 20_000)))]
    gpu_nodes = [node(f"g{i}", cards=2) for i in range(2)]
    setup = LendingSetup("gpupool", load=2.0, hours=24, nodes=2, remote_borrow=True, cpu_nodes=2)
    report = run_lending(gpu_nodes, trace, setup, idle_shares=(0.5,))
    assert report.local_only is not None and not report.local_only.remote_borrow
    assert report.with_lending.remote_borrow and report.with_lending.remote_starts > 0
    data = report.to_json()
    assert data["remote_borrow"] is True and data["cpu_nodes"] == 2
    assert "local_only_idle_harvested_pct" in data
    assert "remote_borrow" not in run_lending(gpu_nodes, trace, setup.__class__("gpupool", hours=24, nodes=2),
                                              idle_shares=(0.5,)).to_json()


def test_cpu_only_nodes_take_the_median_gpu_node() -> None:
    extra = cpu_only_nodes([node("a", cpu=8_000), node("b", cpu=16_000), node("c", cpu=64_000)], 2)
    assert [(n.name, n.cpu_milli, n.cards) for n in extra] == [("cpu-only-000", 16_000, ()),
                                                                ("cpu-only-001", 16_000, ())]
    assert cpu_only_nodes([node()], 0) == []


@pytest.mark.slow
@settings(max_examples=40)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0.1, 6), st.sampled_from([250, 500, 1000]),
                          st.sampled_from([2_000, 16_000, 30_000]), st.floats(0, 5), st.floats(0.1, 3)),
                min_size=1, max_size=14))
def test_random_workloads_with_remote_borrowers_never_overbook(
        specs: list[tuple[float, float, int, int, float, float]]) -> None:
    """The ledgers refuse any overbooking (apply raises), on the CPU nodes as on the GPU nodes."""
    pods = [pod(f"p{i}", arrival, duration, milli=milli, cpu=cpu,
                lendable_h=((start, min(duration, start + length)),) if start < duration else ())
            for i, (arrival, duration, milli, cpu, start, length) in enumerate(specs)]
    nodes = [node("a", cards=2), node("b", cards=1), cpu_node("c", cpu=20_000)]
    outcome = replay(nodes, pods, "gpupool", lending=True, hours=30, remote_borrow=True)
    assert outcome.finished <= len(pods)
    assert outcome.remote_gpu_hours * REMOTE_RATE <= outcome.borrowed_gpu_hours + 1e-3  # both rounded to 1e-3
    assert outcome.remote_gpu_hours <= 30 * 3 + 1e-6 and HOUR > 0


def test_a_borrower_of_two_cards_never_runs_remotely_in_the_replay() -> None:
    """The extender books remote shares of several cards of one node; the replay's remote borrowers
    stay one-card (docs/lending.md's figures): the two-card waiter waits for the owners."""
    import dataclasses

    from gpupool.core.model import GpuRequest

    owners = [pod(f"owner-{i}", 0, 4, cpu=15_000, lendable_h=((1, 3),)) for i in range(2)]
    waiter = pod("waiter", 0.5, 1, cpu=8_000)
    two = dataclasses.replace(waiter.request.containers[0], gpu=GpuRequest.whole(2))
    waiter = dataclasses.replace(waiter, request=dataclasses.replace(waiter.request, containers=(two,)), gpus=2)
    outcome = replay([node("gpu", cards=2, cpu=32_000), cpu_node("cpu")], [*owners, waiter], "gpupool",
                     lending=True, hours=10, remote_borrow=True)
    assert outcome.remote_starts == 0
