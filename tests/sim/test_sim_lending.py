"""The lending replay: idle windows, borrowers on lent GPUs, reclaim when the owner is busy again."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core.model import ContainerRequest, GpuCard, GpuRequest, NodeSpec, PodRequest
from gpupool.sim.arrivals import ArrivingPod, loaded_workload, sample_nodes
from gpupool.sim.idle_model import IdleModel
from gpupool.sim.lending import replay
from gpupool.sim.lending_report import harvested_pct, resume_wait_per_reclaim
from gpupool.sim.trace import TracePod

HOUR = 3600.0


def node(name: str = "n0", cards: int = 1, cpu: int = 32_000) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=cpu, memory_mib=128_000,
                    cards=tuple(GpuCard(index=i, uuid=f"GPU-{name}-{i}", model="T4", memory_mib=16_384)
                                for i in range(cards)))


def pod(key: str, arrival_h: float, duration_h: float, *, milli: int = 1000, cpu: int = 4_000,
        lendable_h: tuple[tuple[float, float], ...] = ()) -> ArrivingPod:
    gpu = GpuRequest.whole() if milli == 1000 else GpuRequest.fraction(milli)
    request = PodRequest(key=key, containers=(ContainerRequest("main", cpu, 1_000, gpu),))
    return ArrivingPod(request=request, arrival_s=arrival_h * HOUR, duration_s=duration_h * HOUR,
                       gpus=milli / 1000, lendable=tuple((a * HOUR, b * HOUR) for a, b in lendable_h))


# ------------------------------------------------------------------------------------ idle model
def test_idle_windows_start_after_the_threshold_and_stay_inside_the_life() -> None:
    model = IdleModel(idle_share=0.4, mean_idle_minutes=30, threshold_minutes=10)
    windows = model.lendable_windows(48 * HOUR, np.random.default_rng(1))
    assert windows
    for start, end in windows:
        assert 0 < start < end <= 48 * HOUR
    assert all(a[1] < b[0] for a, b in itertools.pairwise(windows))


def test_lendable_share_matches_the_model_over_a_long_life() -> None:
    """Exponential idle periods: the part beyond the threshold is share * exp(-threshold / mean)."""
    model = IdleModel(idle_share=0.3, mean_idle_minutes=60, threshold_minutes=10)
    life = 20_000 * HOUR
    lent = sum(end - start for start, end in model.lendable_windows(life, np.random.default_rng(7)))
    assert lent / life == pytest.approx(0.3 * math.exp(-10 / 60), rel=0.05)


def test_no_idle_share_lends_nothing() -> None:
    assert IdleModel(idle_share=0.0).lendable_windows(100 * HOUR, np.random.default_rng(0)) == ()


@pytest.mark.parametrize("kwargs", [
    pytest.param({"idle_share": 1.0}, id="always-idle"),
    pytest.param({"idle_share": -0.1}, id="negative-share"),
    pytest.param({"mean_idle_minutes": 0}, id="zero-period"),
    pytest.param({"threshold_minutes": -1}, id="negative-threshold"),
])
def test_impossible_idle_models_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        IdleModel(**kwargs)


# --------------------------------------------------------------------------------------- replay
def test_a_waiting_pod_borrows_the_idle_card_and_gives_it_back() -> None:
    """One card: the owner idles from 1 h to 2 h; the waiter borrows it then, resumes after the owner."""
    owner = pod("owner", 0, 4, lendable_h=((1, 2),))
    waiter = pod("waiter", 0.5, 1.5)
    without = replay([node()], [owner, waiter], "gpupool", lending=False, hours=10)
    with_lending = replay([node()], [owner, waiter], "gpupool", lending=True, hours=10)
    assert without.borrowed_gpu_hours == 0 and without.reclaims == 0
    assert with_lending.lends == 1 and with_lending.reclaims == 1
    assert with_lending.borrowed_gpu_hours == pytest.approx(1.0)  # 1 h to 2 h on the lent card
    assert with_lending.allocated_gpu_hours == pytest.approx(4.0 + 0.5)  # owner, then the rest of the waiter
    assert without.allocated_gpu_hours == pytest.approx(4.0 + 1.5)
    # the waiter started at 1 h instead of 4 h; both finish within the horizon
    assert with_lending.mean_wait_hours == pytest.approx((0 + 0.5) / 2)
    assert without.mean_wait_hours == pytest.approx((0 + 3.5) / 2)
    assert with_lending.finished == without.finished == 2
    # the owner lent 1 GPU-hour and the waiter used all of it; reclaimed at 2 h, it ran again at 4 h
    assert with_lending.lent_gpu_hours == pytest.approx(1.0) and without.lent_gpu_hours == 0
    assert harvested_pct(with_lending) == pytest.approx(100.0)
    assert with_lending.resume_wait_hours == pytest.approx(2.0)
    assert resume_wait_per_reclaim(with_lending) == pytest.approx(2.0)


def test_a_regular_pod_reclaims_a_borrower_in_its_way() -> None:
    """The owner leaves while lending; a newcomer with a regular claim on that card stops the borrower."""
    owner = pod("owner", 0, 2, lendable_h=((1, 2),))
    borrower = pod("borrower", 0.5, 5)
    newcomer = pod("newcomer", 1.5, 1)
    outcome = replay([node()], [owner, borrower, newcomer], "gpupool", lending=True, hours=20)
    # owner done at 2 h; the queue holds the borrower (reclaimed) ahead of the newcomer by request time
    assert outcome.reclaims == 1
    assert outcome.finished == 3


def test_borrowers_need_the_cpu_the_owner_keeps() -> None:
    """An idle owner lends its GPU, never its CPU: a waiter needing the node's CPU cannot borrow."""
    owner = pod("owner", 0, 4, cpu=30_000, lendable_h=((1, 3),))
    waiter = pod("waiter", 0.5, 1, cpu=8_000)
    outcome = replay([node(cpu=32_000)], [owner, waiter], "gpupool", lending=True, hours=10)
    assert outcome.borrowed_gpu_hours == 0 and outcome.lends == 1
    assert outcome.lent_gpu_hours == pytest.approx(2.0)  # offered from 1 h to 3 h, none of it harvested
    assert harvested_pct(outcome) == 0.0


def test_a_lent_window_open_at_the_horizon_or_at_the_owners_end_is_counted_up_to_it() -> None:
    ends_early = pod("a", 0, 2, lendable_h=((1, 2),))  # lends until it finishes at 2 h
    still_idle = pod("b", 0, 50, lendable_h=((3, 40),))  # still lending when the replay stops at 10 h
    outcome = replay([node(cards=2)], [ends_early, still_idle], "gpupool", lending=True, hours=10)
    assert outcome.lent_gpu_hours == pytest.approx(1.0 + 7.0)


@pytest.mark.slow
@settings(max_examples=40)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0.1, 6), st.sampled_from([250, 500, 1000]),
                          st.floats(0, 5), st.floats(0.1, 3)), min_size=1, max_size=14))
def test_random_workloads_never_overbook(specs: list[tuple[float, float, int, float, float]]) -> None:
    """The ledgers refuse any overbooking (apply raises); in aggregate the cluster serves no more
    GPU-hours than it has plus the idle owners' (which count as allocated while borrowers use them),
    and nothing is borrowed unless an owner lent.

    Borrowed GPU-hours are all the GPU-hours borrowers ran (the issue's "served to borrowers"), which
    can exceed the owners' idle time: a borrower may sit on a lent share plus capacity freed later.
    """
    pods = [pod(f"p{i}", arrival, duration, milli=milli,
                lendable_h=((start, min(duration, start + length)),) if start < duration else ())
            for i, (arrival, duration, milli, start, length) in enumerate(specs)]
    nodes = [node("a", cards=2), node("b", cards=1)]
    hours = 30
    without = replay(nodes, pods, "gpupool", lending=False, hours=hours)
    with_lending = replay(nodes, pods, "gpupool", lending=True, hours=hours)
    idle_gpu_hours = sum(p.gpus * (end - start) / HOUR for p in pods for start, end in p.lendable)
    served = with_lending.allocated_gpu_hours + with_lending.borrowed_gpu_hours
    assert served <= 3 * hours + idle_gpu_hours + 1e-6
    assert with_lending.borrowed_gpu_hours == 0 or with_lending.lends > 0
    assert without.borrowed_gpu_hours == 0
    assert with_lending.pods == without.pods == len(pods)
    assert with_lending.finished <= len(pods) and without.finished <= len(pods)


def test_without_idle_time_lending_changes_nothing() -> None:
    trace = [TracePod(p.request, 0, int(p.duration_s)) for p in
             (pod("a", 0, 2), pod("b", 0, 1, milli=500), pod("c", 0, 3, milli=250))]
    nodes = sample_nodes([node("a", cards=2), node("b", cards=2)], 2, np.random.default_rng(0))
    work = loaded_workload(trace, nodes, load=2.0, hours=12, idle=IdleModel(idle_share=0.0),
                           rng=np.random.default_rng(3))
    without = replay(nodes, work, "gpupool", lending=False, hours=12)
    with_lending = replay(nodes, work, "gpupool", lending=True, hours=12)
    assert with_lending.borrowed_gpu_hours == 0 and with_lending.lends == 0
    assert (with_lending.finished, with_lending.allocated_gpu_hours, with_lending.mean_wait_hours) == (
        without.finished, without.allocated_gpu_hours, without.mean_wait_hours)


def test_loaded_workload_offers_the_asked_load() -> None:
    trace = [TracePod(pod(f"t{i}", 0, 1, milli=m).request, 0, 3600) for i, m in enumerate((1000, 500))]
    nodes = [node("a", cards=4)]
    work = loaded_workload(trace, nodes, load=1.5, hours=200, idle=IdleModel(), rng=np.random.default_rng(5))
    offered = sum(p.gpus * p.duration_s for p in work) / (4 * 200 * HOUR)
    assert offered == pytest.approx(1.5, rel=0.1)
    assert all(0 <= p.arrival_s <= 200 * HOUR for p in work)
