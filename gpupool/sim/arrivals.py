"""A loaded cluster for the lending replay: pods of the trace arriving at a chosen offered load.

The openb trace spreads its pods over months on a cluster that stays below 1 % allocated when they
are replayed at their own times, so nothing ever waits and lending has nothing to do. Capacity
planning asks the other question: with this workload mix at this load, how long do pods wait, and
how much do idle GPUs give back? So the replay samples the trace's GPU pods (their shapes and
lifetimes) and lets them arrive as a Poisson process whose rate offers ``load`` times the GPU
capacity of the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpupool.core.model import NodeSpec, PodRequest
from gpupool.core.units import COMPUTE_PER_CARD
from gpupool.sim.idle_model import IdleModel
from gpupool.sim.trace import TracePod

MAX_LIFETIME_S = 7 * 24 * 3600
"""Longest pod lifetime kept from the trace; the few pods still running when it ended are cut here."""

MIN_LIFETIME_S = 60
"""Shortest lifetime: the trace's sub-minute pods are kept, as one minute."""


@dataclass(frozen=True)
class ArrivingPod:
    """One pod of the loaded workload: what it asks, when it arrives, how long it runs, when it idles."""

    request: PodRequest
    arrival_s: float
    duration_s: float
    gpus: float  # cards' worth of compute the pod holds (0.5 = half a card)
    lendable: tuple[tuple[float, float], ...]  # idle windows after its start, see IdleModel


def gpu_pods(pods: Sequence[TracePod]) -> list[TracePod]:
    """The trace's pods that ask for GPUs (CPU-only pods never lend or borrow)."""
    return [p for p in pods if p.request.gpu_milli_total() > 0]


def lifetime_s(pod: TracePod) -> float:
    """The pod's lifetime in the trace, clamped to [MIN_LIFETIME_S, MAX_LIFETIME_S]."""
    end = pod.deletion_time if pod.deletion_time is not None else pod.creation_time + MAX_LIFETIME_S
    return float(min(MAX_LIFETIME_S, max(MIN_LIFETIME_S, end - pod.creation_time)))


def sample_nodes(nodes: Sequence[NodeSpec], count: int, rng: np.random.Generator) -> list[NodeSpec]:
    """``count`` GPU nodes of the cluster drawn without replacement (all of them when count is larger)."""
    gpu_nodes = [n for n in nodes if n.cards]
    if count >= len(gpu_nodes):
        return list(gpu_nodes)
    chosen = sorted(rng.choice(len(gpu_nodes), size=count, replace=False).tolist())
    return [gpu_nodes[i] for i in chosen]


def loaded_workload(trace: Sequence[TracePod], nodes: Sequence[NodeSpec], *, load: float, hours: float,
                    idle: IdleModel, rng: np.random.Generator) -> list[ArrivingPod]:
    """Pods arriving over ``hours`` so that they offer ``load`` x the cluster's GPU capacity."""
    shapes = gpu_pods(trace)
    if not shapes:
        raise ValueError("the trace has no GPU pods to draw from")
    if load <= 0 or hours <= 0:
        raise ValueError(f"load and hours must be positive, got load {load}, hours {hours}")
    capacity = sum(len(n.cards) for n in nodes)
    gpus = np.array([p.request.gpu_milli_total() / COMPUTE_PER_CARD for p in shapes])
    lifetimes = np.array([lifetime_s(p) for p in shapes])
    offered_per_pod = float(np.mean(gpus * lifetimes))  # GPU-seconds one arrival brings, on average
    rate = load * capacity / offered_per_pod  # arrivals per second
    horizon = hours * 3600.0
    count = int(rng.poisson(rate * horizon))
    times = np.sort(rng.uniform(0.0, horizon, size=count))
    picks = rng.integers(0, len(shapes), size=count)
    workload: list[ArrivingPod] = []
    for position, (time, pick) in enumerate(zip(times.tolist(), picks.tolist(), strict=True)):
        template = shapes[pick]
        request = replace(template.request, key=f"lend-{position:06d}")
        duration = float(lifetimes[pick])
        workload.append(ArrivingPod(request=request, arrival_s=time, duration_s=duration,
                                    gpus=float(gpus[pick]), lendable=idle.lendable_windows(duration, rng)))
    return workload
