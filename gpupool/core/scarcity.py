"""GPU-model scarcity: how much a workload's model-restricted pods need each model's cards.

Why this exists: when some pods may run only on certain GPU models (the trace's ``gpu_spec``, a
pod's ``gpupool.io/gpu-models``), every unrestricted pod placed on those models takes capacity the
restricted ones cannot find elsewhere. On the openb ``gpuspec10`` trace, T4-only pods failed while
52 G2 cards sat idle. FGD's measure weighs each restricted class only by its frequency, which is
small, so it hardly steers unrestricted pods away.

The scarcity of model ``m`` is the share of the workload's GPU demand that is restricted to a set
containing ``m`` (spread over the set's models in proportion to their capacity), divided by ``m``'s
share of the cluster's GPU capacity. It is 0 for models nobody is restricted to. A policy charges a
pod ``weight * milli-GPU * scarcity`` for placing on a card of that model.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpupool.core.fragmentation import WorkloadProfile


def model_scarcity(profile: WorkloadProfile, capacity: Mapping[str, int]) -> dict[str, float]:
    """Scarcity per model present in ``capacity`` (milli-GPU per model); models absent score 0."""
    gpu_pods = profile.gpu_pods()
    total_demand = sum(p.freq * p.milli * p.count for p in gpu_pods)
    total_capacity = sum(capacity.values())
    if total_demand <= 0 or total_capacity <= 0:
        return {}
    restricted: dict[str, float] = {}
    for pod in gpu_pods:
        allowed = [m for m in sorted(pod.models) if capacity.get(m, 0) > 0]
        if not pod.models or not allowed:
            continue
        allowed_capacity = sum(capacity[m] for m in allowed)
        demand = pod.freq * pod.milli * pod.count
        for model in allowed:
            restricted[model] = restricted.get(model, 0.0) + demand * capacity[model] / allowed_capacity
    return {m: (d / total_demand) / (capacity[m] / total_capacity) for m, d in restricted.items()}
