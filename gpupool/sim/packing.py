"""The FGD paper's packing experiment: fill the cluster until 130 % of its GPUs are asked for.

Method (Weng et al., ATC'23, and the trace's README): sort pods by name and shuffle them with the
seed; append pods sampled uniformly with replacement from the original list until the requested GPU
reaches 130 % of the cluster's; schedule each pod once (no departures; a pod that fits nowhere is
skipped); after every pod record the allocated GPU share against the arrived demand. Node order for
equal scores is a random permutation fixed by the seed, as in the paper's simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupool.core.fragmentation import FragmentationMeasure, WorkloadProfile
from gpupool.core.model import NodeSpec, Placement, PodRequest
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler, Unschedulable
from gpupool.core.state import ClusterState, IntArray
from gpupool.sim.fragment_log import FragmentLog

REPORT_POINTS = (90, 95, 100, 110, 130)
INFLATION = 1.3


@dataclass(frozen=True)
class SeedResult:
    """One seed's curve: unallocated GPU % and fragmentation % by arrived demand % (0..130)."""

    seed: int
    unallocated_pct: dict[int, float]
    fragmentation_pct: dict[int, float]
    pods_total: int
    pods_failed: int
    seconds: float = 0.0

    def at(self, point: int) -> float:
        return self.unallocated_pct[point]


@dataclass
class _Recorder:
    capacity: int
    sums: dict[int, float] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    frag_sums: dict[int, float] = field(default_factory=dict)

    def add(self, arrived: int, used: int, fragmentation_pct: float = 0.0) -> int:
        """Record the state after one pod; returns its arrived-demand bin."""
        arrive_pct = round(arrived * 100 / self.capacity)
        alloc_pct = round(used * 100 / self.capacity, 2)
        self.sums[arrive_pct] = self.sums.get(arrive_pct, 0.0) + alloc_pct
        self.counts[arrive_pct] = self.counts.get(arrive_pct, 0) + 1
        self.frag_sums[arrive_pct] = self.frag_sums.get(arrive_pct, 0.0) + fragmentation_pct
        return arrive_pct

    def fragmentation(self) -> dict[int, float]:
        """Mean fragmentation % of the pods in each bin (bins without pods are left out)."""
        return {x: round(self.frag_sums[x] / n, 4) for x, n in sorted(self.counts.items())}

    def curve(self, upto: int = 130) -> dict[int, float]:
        """Unallocated % for every arrived-demand % from 0 to ``upto``.

        A bin with samples is their mean; an empty bin borrows its neighbours (the paper's
        smoothing); a bin with none nearby keeps the last value before it, because nothing arrived
        in between (a small cluster jumps several percent per pod). Before any arrival all is idle.
        Points beyond the last arrival (and its neighbour) stay undefined: that demand never came.
        """
        curve: dict[int, float] = {}
        last = 100.0
        for x in range(min(upto, max(self.counts, default=-2) + 1) + 1):
            if x in self.counts:
                curve[x] = round(100.0 - self.sums[x] / self.counts[x], 4)
            else:
                near = [k for k in (x - 1, x, x + 1) if k in self.counts]
                if near:
                    total = sum(self.sums[k] for k in near) / sum(self.counts[k] for k in near)
                    curve[x] = round(100.0 - total, 4)
                else:
                    curve[x] = last
            last = curve[x]
        return curve


def workload(pods: Sequence[PodRequest], seed: int, capacity: int) -> list[PodRequest]:
    """The seed's arrival order: shuffled originals, then resampled clones up to 130 % of capacity."""
    rng = np.random.default_rng(seed)
    ordered = sorted(pods, key=lambda p: p.key)
    shuffled = [ordered[i] for i in rng.permutation(len(ordered))]
    demand = sum(p.gpu_milli_total() for p in shuffled)
    target = INFLATION * capacity
    while demand > target and shuffled:
        # A trace larger than 130 % of the cluster is trimmed at random, as the paper's simulator does.
        demand -= shuffled.pop(int(rng.integers(len(shuffled)))).gpu_milli_total()
    clone = 0
    if not any(p.gpu_milli_total() for p in ordered):
        return shuffled
    while demand < target:
        source = ordered[int(rng.integers(len(ordered)))]
        extra = source.gpu_milli_total()
        if demand + extra > target:
            break
        shuffled.append(PodRequest(key=f"{source.key}-tuned-{clone}", containers=source.containers))
        demand += extra
        clone += 1
    return shuffled


def tie_order(seed: int, size: int) -> IntArray:
    """The seed's node order for equal scores: a random permutation of the rows (lower wins)."""
    return np.random.default_rng(seed).permutation(size).astype(np.int64)


def policy_rng(seed: int) -> np.random.Generator:
    """The seed's generator for policies that draw (random) and for unranked ties."""
    return np.random.default_rng(seed + 1_000_003)


def run_seed(nodes: Sequence[NodeSpec], pods: Sequence[PodRequest], policy_name: str, seed: int,
             profile: WorkloadProfile | None = None,
             progress: Callable[[int], None] | None = None,
             on_decision: Callable[[PodRequest, Placement | Unschedulable], None] | None = None) -> SeedResult:
    """Replay one seed; ``progress`` is called with the number of pods done every few hundred,
    ``on_decision`` with every pod and what was decided for it (``bench/sim_placements.py`` hashes
    them to show that a change to the hot path moved no placement)."""
    import time

    started = time.perf_counter()
    state = ClusterState(nodes)
    capacity = state.total_compute()
    arrivals = workload(pods, seed, capacity)
    rng = policy_rng(seed)
    tie_rank = tie_order(seed, state.size)
    profile = profile or WorkloadProfile.from_pods(pods)
    scheduler = Scheduler(state, make_policy(policy_name, rng), profile=profile, tie_rank=tie_rank, rng=rng)
    log = FragmentLog(state, FragmentationMeasure(state, profile))
    recorder = _Recorder(capacity)
    arrived = used = failed = 0
    for done, pod in enumerate(arrivals, start=1):
        arrived += pod.gpu_milli_total()
        decision = scheduler.schedule(pod)
        if on_decision is not None:
            on_decision(pod, decision)
        row = None
        if isinstance(decision, Placement):
            used += sum(s.compute for c in decision.containers if not c.init for s in c.slices)
            row = state.index[decision.node]
        else:
            failed += 1
        for outcome in log.record(arrived, used, row):
            recorder.add(outcome.arrived, outcome.used, outcome.fragmentation_pct)
        if progress is not None and done % 500 == 0:
            progress(500)
    for outcome in log.flush():
        recorder.add(outcome.arrived, outcome.used, outcome.fragmentation_pct)
    if progress is not None:
        progress(len(arrivals) % 500)
    return SeedResult(seed=seed, unallocated_pct=recorder.curve(), fragmentation_pct=recorder.fragmentation(),
                      pods_total=len(arrivals), pods_failed=failed,
                      seconds=round(time.perf_counter() - started, 3))
