"""Synthetic pods for one node, placed by the real allocation core (tests and bench/allocate.py).

Each pod gets realistic gpupool limits and an ``assignment-v1`` annotation computed by
:func:`gpupool.core.cards.assign_on_node` on a :class:`ClusterState`, exactly as the extender would
write it, so the node side is exercised with assignments the scheduler can really produce: equal
requests on different cards, multi-container pods, GPU init containers, GPU sidecars (as app
containers and as native sidecars: init containers with ``restartPolicy: Always``, which the
extender counts as app containers), whole cards.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass
from typing import Any

from gpupool.api.annotations import Assignment, encode_assignment
from gpupool.api.names import ResourceNames
from gpupool.core.cards import assign_on_node
from gpupool.core.model import (
    ContainerRequest,
    GpuCard,
    GpuRequest,
    NodeSpec,
    Placement,
    PodRequest,
)
from gpupool.core.state import ClusterState
from gpupool.nodeagent.types import MEMORY_UNIT

SHARED_SHAPES = ((1, 10), (2, 10), (2, 20), (4, 20), (4, 30), (8, 50))
"""(memory in 256 MiB units, compute per-mille) of the shared slices; few shapes so many pods
have identical requests."""


@dataclass(frozen=True)
class WorkloadPod:
    """A generated pod: its JSON for the fake API and its placement."""

    json: dict[str, Any]
    placement: Placement

    @property
    def key(self) -> tuple[str, str]:
        meta = self.json["metadata"]
        return (meta["namespace"], meta["name"])


def fake_gpu_file(cards: int, memory_mib: int = 81920,
                  model: str = "NVIDIA-A100-SXM4-80GB") -> dict[str, Any]:
    """The fake backend's YAML structure for ``cards`` equal cards in pairs behind switches."""
    groups = [[i, i + 1] for i in range(0, cards - 1, 2)]
    return {"model": model, "topology": groups,
            "cards": [{"uuid": f"GPU-{i:08x}-0000-4000-8000-{i:012x}", "memoryMiB": memory_mib}
                      for i in range(cards)]}


def limits_for(names: ResourceNames, placement: Placement, container: str) -> dict[str, int]:
    """The container's gpupool limits, per card as users write them (see ResourceNames)."""
    for a in placement.containers:
        if a.container != container:
            continue
        if any(s.exclusive for s in a.slices):
            return {names.gpu: len(a.slices)}
        first = a.slices[0]
        limits = {names.gpu_mem: first.memory_mib // MEMORY_UNIT, names.gpu_core: first.compute // 10}
        if len(a.slices) > 1:
            limits[names.gpu_shared] = len(a.slices)  # a slice of several cards
        return limits
    return {}


#: The bind time written into generated assignments (any fixed time: nothing reads it as "now").
ASSIGNED_AT = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def _shared(rng: random.Random) -> GpuRequest:
    units, compute = rng.choice(SHARED_SHAPES)
    return GpuRequest(count=1, compute=compute, memory_mib=units * MEMORY_UNIT)


def _pod_request(i: int, rng: random.Random, whole_left: list[int]) -> tuple[PodRequest, frozenset[str]]:
    """The request as the core sees it, and which of its app containers the pod declares as native
    sidecars (init containers with ``restartPolicy: Always``)."""
    kind = rng.random()
    key = f"team-{i % 3}/pod-{i:04d}"
    app_only: frozenset[str] = frozenset()
    if kind < 0.05 and whole_left[0] > 0:
        whole_left[0] -= 1
        return PodRequest(key, (ContainerRequest("main", gpu=GpuRequest.whole(1)),)), app_only
    if kind < 0.20:  # two GPU containers and a sidecar without GPU
        return PodRequest(key, (ContainerRequest("worker", gpu=_shared(rng)),
                                ContainerRequest("helper", gpu=_shared(rng)),
                                ContainerRequest("log-shipper"))), app_only
    if kind < 0.25:  # GPU init container (warm-up) then GPU app
        return PodRequest(key, (ContainerRequest("main", gpu=_shared(rng)),),
                          init_containers=(ContainerRequest("warmup", gpu=_shared(rng)),)), app_only
    if kind < 0.30:  # GPU init container, then a native GPU sidecar (kubelet hands it the warm-up's
        # devices) beside the GPU app
        main, warmup = _shared(rng), _shared(rng)
        return PodRequest(key, (ContainerRequest("main", gpu=main), ContainerRequest("gpu-sidecar", gpu=warmup)),
                          init_containers=(ContainerRequest("warmup", gpu=warmup),)), frozenset({"gpu-sidecar"})
    if kind < 0.35:  # app without GPU, GPU sidecar as an app container
        return PodRequest(key, (ContainerRequest("app"), ContainerRequest("gpu-sidecar", gpu=_shared(rng)))), app_only
    if kind < 0.40:  # app without GPU, native GPU sidecar
        return (PodRequest(key, (ContainerRequest("app"), ContainerRequest("gpu-sidecar", gpu=_shared(rng)))),
                frozenset({"gpu-sidecar"}))
    return PodRequest(key, (ContainerRequest("main", gpu=_shared(rng)),)), app_only


def generate(count: int, cards: int = 16, seed: int = 0, node: str = "node-a",
             names: ResourceNames | None = None) -> tuple[dict[str, Any], list[WorkloadPod]]:
    """A fake-GPU file structure and ``count`` pods placed on it by the core."""
    names = names or ResourceNames()
    rng = random.Random(seed)
    gpu_file = fake_gpu_file(cards)
    gpu_cards = tuple(GpuCard(index=i, uuid=c["uuid"], model=gpu_file["model"], memory_mib=c["memoryMiB"])
                      for i, c in enumerate(gpu_file["cards"]))
    spec_of_node = NodeSpec(node, cpu_milli=10**7, memory_mib=10**8, cards=gpu_cards)
    state = ClusterState([spec_of_node], max_cards=cards)
    whole_left = [max(1, cards // 8)]
    pods: list[WorkloadPod] = []
    created = list(range(count))
    rng.shuffle(created)  # creation order differs from generation (and admission) order
    for i in range(count):
        request, sidecars = _pod_request(i, rng, whole_left)
        placement = assign_on_node(state, 0, request)
        if isinstance(placement, str):
            raise RuntimeError(f"workload does not fit the node: {placement}")
        state.apply(placement)
        namespace, name = request.key.split("/")
        def spec(c: ContainerRequest, p: Placement = placement) -> dict[str, Any]:
            return {"name": c.name, "resources": {"limits": limits_for(names, p, c.name)}}
        pods.append(WorkloadPod(json={
            "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{i:04d}",
                         "creationTimestamp": f"2024-01-01T00:{created[i] // 60:02d}:{created[i] % 60:02d}Z",
                         "annotations": {names.assignment:
                                         encode_assignment(Assignment.from_placement(
                                             placement, spec_of_node, ASSIGNED_AT))}},
            "spec": {"nodeName": node,
                     "initContainers": [spec(c) for c in request.init_containers]
                     + [{**spec(c), "restartPolicy": "Always"} for c in request.containers if c.name in sidecars],
                     "containers": [spec(c) for c in request.containers if c.name not in sidecars]},
            "status": {"phase": "Pending"}}, placement=placement))
    return gpu_file, pods
