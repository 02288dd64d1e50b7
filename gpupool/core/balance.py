"""CPU–GPU balance: how much of a node's free GPU its free CPU can no longer feed.

Why this exists: on Alibaba's openb cluster most GPU nodes carry about 12 cores per GPU while the
workload's GPU pods ask about 11 per GPU, some far more and some far less. FGD's fragmentation
measure only notices CPU when a typical pod stops fitting on a node at all, so CPU-heavy GPU pods
land on CPU-poor nodes as readily as on CPU-rich ones, and the last GPUs of CPU-poor nodes end up
with no CPU to go with them. Measured on the default trace, that stranding (not card fragments) was
most of what separated FGD from the offline packing bound (docs/policies.md); weighing it for GPU
pods is what helps (CPU-only pods alone: no gain), because it pairs CPU-heavy GPU pods with CPU-rich
nodes and CPU-light ones with CPU-poor nodes.

The *stranded* GPU of a node is the free GPU its free CPU cannot serve at the workload's own CPU per
GPU ratio ``kappa``: ``max(0, gpu_free - cpu_free / kappa)``. Placement policies add the change of
this quantity to their score, so a pod goes where it strands least.

CPU-only pods measure it against a much larger reserve (:func:`cpu_only_kappa`). At ``kappa`` itself,
the CPU of a CPU-rich node beyond ``kappa`` per free GPU looks free, so CPU-only pods pile onto the
CPU-rich nodes (openb's T4 nodes: 52 cores per GPU) while those still have free GPUs. When the
workload's CPU comes close to the cluster's, every node ends at exactly ``kappa`` per free GPU and the
GPU pods that ask more than that per GPU (18-25 cores per GPU for a tenth of the GPU demand) fit
nowhere: on a generated 25 % CPU-only workload (cpu250, seed 42) GPU pods started failing at 88 %
arrived instead of 94 %. With the large reserve a CPU-only pod pays for every core it takes from a node that still
has free GPU, goes first to nodes whose GPUs are all allocated, and otherwise spreads over the node
kinds, which leaves the CPU-rich nodes' headroom to the CPU-heavy GPU pods.
"""

from __future__ import annotations

import numpy as np

from gpupool.core.fragmentation import FloatArray, WorkloadProfile


def cpu_per_gpu_milli(profile: WorkloadProfile) -> float | None:
    """CPU milli the workload's GPU pods ask per milli-GPU, frequency-weighted; None without any."""
    gpu_pods = profile.gpu_pods()
    gpu = sum(p.milli * p.count * p.freq for p in gpu_pods)
    if gpu <= 0:
        return None
    return sum(p.cpu_milli * p.freq for p in gpu_pods) / gpu


def cpu_only_kappa(kappa: float, reserve: float) -> float:
    """The CPU per milli-GPU a node keeps for its free GPU when a CPU-only pod is placed: ``reserve``
    times the GPU pods' ``kappa`` (``reserve`` >= 1; 1 treats CPU-only and GPU pods alike)."""
    if reserve < 1.0:
        raise ValueError(f"the CPU-only reserve must be at least 1 x kappa, got {reserve}")
    return kappa * reserve


def stranded_gpu(gpu_free: FloatArray, cpu_free: FloatArray, kappa: float) -> FloatArray:
    """Free milli-GPU per node that ``cpu_free`` cannot feed at ``kappa`` CPU milli per milli-GPU."""
    result: FloatArray = np.maximum(0.0, gpu_free - cpu_free / kappa)
    return result


def stranding_increase(gpu_free: FloatArray, cpu_free: FloatArray, kappa: float, gpu_taken: float,
                       cpu_taken: float) -> FloatArray:
    """How much stranded GPU each node gains (negative: loses) if it gives up the pod's GPU and CPU."""
    before = stranded_gpu(gpu_free, cpu_free, kappa)
    after = stranded_gpu(np.maximum(gpu_free - gpu_taken, 0.0), cpu_free - cpu_taken, kappa)
    result: FloatArray = after - before
    return result
