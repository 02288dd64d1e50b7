"""Replaying a trace in time: pods arrive at their creation time and leave at their deletion time.

This is the basis for capacity planning (how much of the cluster is in use over a day, how many pods
would have been refused) and, later, for idle-GPU lending. Unlike the packing experiment, pods that
fit nowhere are not retried: the count of refusals is itself the answer a planner needs.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core.fragmentation import WorkloadProfile
from gpupool.core.model import NodeSpec, Placement
from gpupool.core.policies import make_policy
from gpupool.core.scheduler import Scheduler
from gpupool.core.state import ClusterState
from gpupool.sim.trace import TracePod


@dataclass(frozen=True)
class TimelinePoint:
    """The cluster at one moment of the replay."""

    time: int
    allocated_gpu_pct: float
    running_pods: int
    refused_pods: int


@dataclass(frozen=True)
class TimelineResult:
    policy: str
    points: tuple[TimelinePoint, ...]
    refused_pods: int
    peak_allocated_gpu_pct: float
    mean_allocated_gpu_pct: float


def replay_timeline(nodes: Sequence[NodeSpec], pods: Sequence[TracePod], policy_name: str,
                    samples: int = 200, seed: int = 42) -> TimelineResult:
    """Replay arrivals and departures in time order and sample the allocation ``samples`` times.

    At equal times departures go first, so a pod leaving at t frees room for one arriving at t.
    """
    state = ClusterState(nodes)
    capacity = state.total_compute()
    profile = WorkloadProfile.from_pods([p.request for p in pods])
    rng = np.random.default_rng(seed)
    scheduler = Scheduler(state, make_policy(policy_name, rng), profile=profile,
                          tie_rank=rng.permutation(state.size).astype(np.int64), rng=rng)
    events: list[tuple[int, int, int]] = []  # (time, 0 = departure / 1 = arrival, pod position)
    for position, pod in enumerate(pods):
        events.append((pod.creation_time, 1, position))
    heapq.heapify(events)
    start = min(p.creation_time for p in pods)
    end = max(max(p.creation_time, p.deletion_time or p.creation_time) for p in pods)
    step = max(1, (end - start) // max(samples, 1))
    next_sample = start
    used = running = refused = 0
    held: dict[int, int] = {}
    points: list[TimelinePoint] = []
    while events:
        time, kind, position = heapq.heappop(events)
        while time >= next_sample and next_sample <= end:
            points.append(TimelinePoint(next_sample, round(100.0 * used / capacity, 3), running, refused))
            next_sample += step
        pod = pods[position]
        if kind == 0:
            if state.release(pod.request.key) is not None:
                used -= held.pop(position, 0)
                running -= 1
            continue
        decision = scheduler.schedule(pod.request)
        if isinstance(decision, Placement):
            took = sum(s.compute for c in decision.containers if not c.init for s in c.slices)
            held[position] = took
            used += took
            running += 1
            if pod.deletion_time is not None:
                heapq.heappush(events, (max(pod.deletion_time, time), 0, position))
        else:
            refused += 1
    points.append(TimelinePoint(end, round(100.0 * used / capacity, 3), running, refused))
    allocated = [p.allocated_gpu_pct for p in points]
    return TimelineResult(policy=policy_name, points=tuple(points), refused_pods=refused,
                          peak_allocated_gpu_pct=max(allocated),
                          mean_allocated_gpu_pct=round(float(np.mean(allocated)), 3))
