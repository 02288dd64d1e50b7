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
