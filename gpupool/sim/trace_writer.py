"""Writing a cluster and its pods in the trace format :mod:`gpupool.sim.trace` reads.

The format is Alibaba's openb CSV: a pod has one GPU request, ``num_gpu`` cards of ``gpu_milli``
thousandths each, memory in proportion (1000 is a whole card, exclusive). A pod of a live cluster
can ask for more than that says (memory apart from compute, several GPU containers, a card kind),
so each pod is turned into the one row that books at least what the pod books, or refused with the
reason; ``gpupool simulate export`` (docs/simulator.md, "Your own cluster") reports the refusals.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

from gpupool.core.model import GpuRequest, NodeSpec, PodRequest
from gpupool.core.units import COMPUTE_PER_CARD

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model", "gpu_memory_mib")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
               "creation_time", "deletion_time", "scheduled_time")


class TraceShapeError(ValueError):
    """A pod the trace format cannot hold; the message says why."""


@dataclass(frozen=True)
class TraceGpu:
    """A pod's GPU request in the trace's terms: ``count`` cards of ``milli`` thousandths each."""

    count: int
    milli: int
    models: frozenset[str] = frozenset()

    @property
    def spec(self) -> str:
        """The ``gpu_spec`` column: the allowed models joined by ``|`` (empty: any)."""
        return "|".join(sorted(self.models))


@dataclass(frozen=True)
class PodTimes:
    """A pod's phase and times in seconds on the trace's clock (None: not yet)."""

    phase: str
    qos: str
    creation_time: int
    scheduled_time: int | None = None
    deletion_time: int | None = None


def trace_gpu(request: PodRequest, card_memory_mib: int) -> TraceGpu | None:
    """The trace's GPU request for ``request`` (None: no GPU); ``card_memory_mib`` is the memory of
    the card its memory is measured against (the node it runs on, or the cluster's usual card).

    ``gpu_milli`` is the larger of the compute share and the memory share of the card, because the
    trace ties memory to compute: a 4 GiB, 10 % slice of a 16 GiB card books 250 milli. A share of
    1000 or more is a whole card. Init containers' GPUs are left out (they hold the card before
    the app containers do, and the trace has no such phase)."""
    gpus = [c.gpu for c in request.gpu_containers if c.gpu is not None]
    if not gpus:
        if any(c.gpu is not None for c in request.init_containers):
            raise TraceShapeError("only an init container asks for GPUs; the trace has no init containers")
        return None
    if len(gpus) > 1:
        raise TraceShapeError(f"{len(gpus)} containers ask for GPUs; the trace holds one GPU request per pod")
    (gpu,) = gpus
    if gpu.kind is not None:
        raise TraceShapeError(f"asks for {gpu.kind.value} cards only; the trace has no card kinds")
    if gpu.exclusive:
        return TraceGpu(gpu.count, COMPUTE_PER_CARD, gpu.models)
    milli = max(gpu.compute, _memory_milli(gpu, card_memory_mib))
    return TraceGpu(gpu.count, min(milli, COMPUTE_PER_CARD), gpu.models)


def _memory_milli(gpu: GpuRequest, card_memory_mib: int) -> int:
    if gpu.memory_share is not None:
        return gpu.memory_share
    if not gpu.memory_mib:
        return 0  # proportional to compute, or none
    if card_memory_mib <= 0:
        raise TraceShapeError("asks for GPU memory, and no card of the cluster says how much it has")
    return -(-gpu.memory_mib * COMPUTE_PER_CARD // card_memory_mib)


def node_row(node: NodeSpec) -> dict[str, str]:
    """A node as a row of the node list: its allocatable CPU and memory, its cards' count, model and
    memory (those of the first card: the format holds one model per node)."""
    first = node.cards[0] if node.cards else None
    return {"sn": node.name, "cpu_milli": str(node.cpu_milli), "memory_mib": str(node.memory_mib),
            "gpu": str(len(node.cards)), "model": first.model if first else "",
            "gpu_memory_mib": str(first.memory_mib) if first else ""}


def pod_row(request: PodRequest, gpu: TraceGpu | None, times: PodTimes) -> dict[str, str]:
    """A pod as a row of the pod list (CPU and memory as the scheduler counts them)."""
    return {"name": request.key, "cpu_milli": str(request.cpu_milli), "memory_mib": str(request.memory_mib),
            "num_gpu": str(gpu.count if gpu else 0), "gpu_milli": str(gpu.milli if gpu else 0),
            "gpu_spec": gpu.spec if gpu else "", "qos": times.qos, "pod_phase": times.phase,
            "creation_time": str(times.creation_time), "deletion_time": _optional(times.deletion_time),
            "scheduled_time": _optional(times.scheduled_time)}


def _optional(value: int | None) -> str:
    return "" if value is None else str(value)


def write_rows(handle: TextIO, columns: Sequence[str], rows: Iterable[Mapping[str, str]]) -> int:
    """The header and ``rows`` as CSV; returns the number of rows written."""
    writer = csv.DictWriter(handle, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    count = 0
    for row in rows:
        writer.writerow(row)
        count += 1
    return count
